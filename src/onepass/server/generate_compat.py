"""``POST /generate``: candidate scoring in SGLang's request shape, so a onepass worker can sit
behind a cache-aware router.

``sglang-router`` (0.3.2) forwards only its own typed routes and re-serialises each body: its
``/v1/completions`` takes text prompts only and ``/v1/systemone`` is not forwarded at all, so
the one route that carries a decision prompt as exact token ids is SGLang's native
``/generate``. This route answers the scoring subset of it — ``input_ids`` (one prompt or a
batch), ``token_ids_logprob`` (one id list for every prompt, or one per prompt) and
``sampling_params.max_new_tokens`` 0 or 1 — through the same packed fast path and prefix cache
as ``/v1/systemone``: the batch's longest common token prefix is the cached prefix, each rest
is a suffix. Nothing is generated.

The answer mirrors SGLang's ``meta_info`` except for one name: the values are the candidates'
*logits* (``output_token_ids_logits``), not log-probabilities over the vocabulary (the fast path
computes only the asked rows; a restricted softmax over them is what a decision reads). Fields
the router adds at their defaults are accepted; any that asks for something else is a 400.
One call is bounded like a decision's questions: its prompts, the tokens it computes and the
logits it answers with (``max_generate_prompts`` / ``_tokens`` / ``_logits``, 413 above each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from onepass import limits
from onepass.contract import ContractError
from onepass.server.body import read_json
from onepass.server.context import StrictJSONResponse
from onepass.server.errors import ApiError
from onepass.server.settings import ServerSettings

# the fields sglang-router 0.3.2 writes into every forwarded /generate body, at the values it
# writes when the client did not ask (anything else asks for work this route does not do)
_ROUTER_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "model": (None,), "return_text_in_logprobs": (False,), "stream": (False,),
    "log_metrics": (True, False), "return_hidden_states": (False,), "background": (False,),
    "no_logs": (False, True), "return_bytes": (False,), "return_entropy": (False,),
    "return_logprob": (True, False), "logprob_start_len": (-1,),
}
_FIELDS = {"input_ids", "token_ids_logprob", "sampling_params", "rid"}


class ScoringParams(BaseModel):
    """``sampling_params``: only the output length is read (nothing is generated)."""

    max_new_tokens: int = Field(ge=0, le=1, description="0 or 1: the candidates are read at "
                                "the end of the prompt either way")


class GenerateScoringRequest(BaseModel):
    """The scoring subset of SGLang's ``GenerateReqInput`` that ``POST /generate`` answers
    (documentation: the route parses the body itself, accepting sglang-router's added fields
    at their default values)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "input_ids": [[1, 504, 3458, 28, 314], [1, 504, 3458, 28, 5248]],
        "token_ids_logprob": [330, 389], "sampling_params": {"max_new_tokens": 0}}]})
    input_ids: list[int] | list[list[int]] = Field(
        description="one prompt or a batch, as token ids; the batch's longest common prefix is "
        "the cached prefix")
    token_ids_logprob: list[int] | list[list[int]] = Field(
        description="the candidate ids read at the end of each prompt: one list for every "
        "prompt, or one per prompt")
    sampling_params: ScoringParams
    rid: str | None = Field(None, description="echoed as meta_info.id")


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", "invalid_request_error", field=field)


def _ids(value: Any, field: str) -> list[int]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        raise _bad(field, "expected a non-empty list of token ids (integers >= 0)")
    return list(value)


def parse_generate(body: Any) -> tuple[list[list[int]], list[list[int]], bool]:
    """(prompts, candidate ids per prompt, batch?) of a scoring ``/generate`` body."""
    if not isinstance(body, dict):
        raise _bad("body", "expected a JSON object")
    for key, value in body.items():
        if key in _FIELDS:
            continue
        if key in _ROUTER_DEFAULTS and value in _ROUTER_DEFAULTS[key]:
            continue
        raise _bad(key, "not offered: this onepass route scores token ids (input_ids, "
                   "token_ids_logprob, sampling_params.max_new_tokens 0 or 1); generate with "
                   "POST /v1/completions")
    raw = body.get("input_ids")
    batch = isinstance(raw, list) and bool(raw) and isinstance(raw[0], list)
    prompts = ([_ids(p, f"input_ids[{i}]") for i, p in enumerate(raw)] if batch
               else [_ids(raw, "input_ids")])
    asked = body.get("token_ids_logprob")
    if isinstance(asked, list) and asked and isinstance(asked[0], list):
        if len(asked) != len(prompts):
            raise _bad("token_ids_logprob", f"{len(asked)} id lists for {len(prompts)} prompts")
        candidates = [_ids(c, f"token_ids_logprob[{i}]") for i, c in enumerate(asked)]
    else:
        candidates = [_ids(asked, "token_ids_logprob")] * len(prompts)
    rid = body.get("rid")  # echoed as meta_info.id: a string (a list of them for a batch)
    if rid is not None and not isinstance(rid, str) and not (
            batch and isinstance(rid, list) and len(rid) == len(prompts)
            and all(isinstance(r, str) for r in rid)):
        raise _bad("rid", "expected a request id string (a batch: one per prompt), got "
                   f"{type(rid).__name__}")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _bad("sampling_params", "expected an object")
    steps = params.get("max_new_tokens")
    if steps not in (0, 1):
        raise _bad("sampling_params.max_new_tokens", f"must be 0 or 1 (got {steps!r}): this "
                   "route reads the candidates at the end of the prompt and generates nothing")
    return prompts, candidates, batch


def _too_large(field: str, message: str) -> ApiError:
    return ApiError.of("request_too_large", f"{field}: {message}", field=field)


def check_size(prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]],
               settings: ServerSettings) -> None:
    """Bound the prompts one call packs into a forward and the logits it answers with (the
    answer grows as prompts x candidate ids: 100 x 20,000 was a 62 MB body): 413s."""
    if len(prompts) > settings.max_generate_prompts:
        raise _too_large("input_ids", f"{len(prompts)} prompts is over the limit of "
                         f"{settings.max_generate_prompts} per request (max_generate_prompts); "
                         "split the batch")
    logits = sum(len(c) for c in candidates)
    if logits > settings.max_generate_logits:
        raise _too_large("token_ids_logprob", f"{len(prompts)} prompts with {logits} candidate "
                         f"ids in all is over the limit of {settings.max_generate_logits} "
                         "logits per request (max_generate_logits); ask for fewer candidates "
                         "or split the batch")


def split_prefix(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The longest common token prefix (leaving every suffix at least its last token) and the
    suffixes: the shape the fast path scores in one forward with the prefix cached."""
    shortest = min(len(p) for p in prompts)
    n = 0
    while n < shortest - 1 and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return list(prompts[0][:n]), [list(p[n:]) for p in prompts]


async def generate(request: Request) -> Response:
    """``POST /generate``: score the body's prompts (see the module docstring)."""
    rt = request.app.state.runtime
    settings = rt.settings
    engine = rt.require_engine()

    def check(body: Any) -> tuple[Any, ...]:
        """Every check of the body (CPU over up to the body cap of ids: off the loop)."""
        prompts, candidates, batch = parse_generate(body)
        check_size(prompts, candidates, settings)
        vocab = getattr(engine.backend, "vocab_size", None)
        for i, p in enumerate(prompts):
            if len(p) > engine.max_input_tokens:
                raise limits.too_long(f"input_ids[{i}]" if batch else "input_ids", len(p),
                                      engine.max_input_tokens)
        if vocab is not None:
            for field, lists in (("input_ids", prompts), ("token_ids_logprob", candidates)):
                for ids in lists:
                    limits.check_vocabulary(field, ids, vocab)
        prefix, suffixes = split_prefix(prompts)
        tokens = len(prefix) + sum(len(s) for s in suffixes)
        if tokens > settings.max_generate_tokens:
            raise _too_large("input_ids", f"the batch has {tokens} tokens to score (its "
                             "common prefix once, then every rest), over the limit of "
                             f"{settings.max_generate_tokens} per request "
                             "(max_generate_tokens); split the batch")
        return body, prompts, candidates, batch, prefix, suffixes

    def checked(body: Any) -> tuple[Any, ...]:
        try:
            return check(body)
        except ContractError as exc:  # a limit (onepass.limits): its own status
            raise ApiError.of(exc.kind, str(exc), field=exc.field) from None

    body, prompts, candidates, batch, prefix, suffixes = await read_json(
        request, settings, checked)

    def work() -> Any:
        return (engine.scorer or engine.backend.score)(prefix, suffixes, candidates)

    result = await rt.run(request, work, engine)
    rid = body.get("rid")
    items = [{
        "text": "", "output_ids": [],
        "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": len(p), "completion_tokens": 0,
            "cached_tokens": result.cached_tokens,
            "output_token_ids_logits": [[[float(v), c, None]
                                         for v, c in zip(logits, cands)]],
        },
    } for p, cands, logits in zip(prompts, candidates, result.logits)]
    return StrictJSONResponse(items if batch else items[0])


def register(app: FastAPI, auth: list[Any]) -> None:
    """Add ``POST /generate`` (the scoring subset above) to the app."""
    body_spec = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/GenerateScoringRequest"}}}}}
    app.post("/generate", dependencies=auth, tags=["Operations"], openapi_extra=body_spec,
             summary="SGLang-shaped scoring of token ids (for sglang-router): candidate logits "
             "at the end of each prompt, through the prefix cache")(generate)
