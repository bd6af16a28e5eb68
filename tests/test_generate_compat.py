"""``POST /generate`` (server/generate_compat.py): the SGLang-shaped scoring route that lets a
onepass worker sit behind sglang-router. Bodies below are what sglang-router 0.3.2 forwards
(it re-serialises /generate and adds its default fields); the logits must be the in-process
engine's, and a repeated prompt must come from the prefix cache."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from onepass.server import ServerSettings, create_app
from onepass.server.errors import ApiError
from onepass.server.generate_compat import parse_generate, split_prefix

# the fields sglang-router 0.3.2 added to a forwarded /generate body (captured from the binary)
ROUTER_FIELDS = {"model": None, "return_logprob": True, "logprob_start_len": -1,
                 "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
                 "return_hidden_states": False, "background": False, "no_logs": False,
                 "return_bytes": False, "return_entropy": False}


def test_parse_and_split():
    prompts, cands, batch = parse_generate({"input_ids": [[1, 2, 3], [1, 2, 4, 5]],
                                            "token_ids_logprob": [7, 8],
                                            "sampling_params": {"max_new_tokens": 0},
                                            **ROUTER_FIELDS})
    assert batch and prompts == [[1, 2, 3], [1, 2, 4, 5]] and cands == [[7, 8], [7, 8]]
    assert split_prefix(prompts) == ([1, 2], [[3], [4, 5]])
    assert split_prefix([[1, 2, 3]]) == ([1, 2], [[3]])  # a suffix keeps the last token
    assert split_prefix([[1, 2], [1, 2, 3]]) == ([1], [[2], [2, 3]])
    single = parse_generate({"input_ids": [4, 5], "token_ids_logprob": [[9]],
                             "sampling_params": {"max_new_tokens": 1}})
    assert single == ([[4, 5]], [[9]], False)
    for body, field in [
        ({"input_ids": [1], "token_ids_logprob": [2], "sampling_params": {}},
         "sampling_params.max_new_tokens"),
        ({"input_ids": [1], "token_ids_logprob": [2], "sampling_params": {"max_new_tokens": 8}},
         "sampling_params.max_new_tokens"),
        ({"text": "hi", "token_ids_logprob": [2], "sampling_params": {"max_new_tokens": 0}},
         "text"),
        ({"input_ids": [1], "token_ids_logprob": [2], "stream": True,
          "sampling_params": {"max_new_tokens": 0}}, "stream"),
        ({"input_ids": [], "token_ids_logprob": [2], "sampling_params": {"max_new_tokens": 0}},
         "input_ids"),
        ({"input_ids": [[1], [2]], "token_ids_logprob": [[2]],
          "sampling_params": {"max_new_tokens": 0}}, "token_ids_logprob"),
    ]:
        with pytest.raises(ApiError) as info:
            parse_generate(body)
        assert info.value.status == 400 and info.value.message.startswith(field), body


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, ServerSettings())) as c:
        yield c


def test_generate_scores_like_the_engine_and_hits_the_cache(engine, client):
    tok = engine.backend.tokenizer
    state = tok("Ticket 77: the parcel arrived crushed and late; refund please.",
                add_special_tokens=False)["input_ids"]
    prompts = [state + tok(" Is the customer angry? Answer:", add_special_tokens=False)
               ["input_ids"], state + tok(" Topic? Answer:", add_special_tokens=False)["input_ids"]]
    cands = tok(" A B C", add_special_tokens=False)["input_ids"]
    body = {"input_ids": prompts, "token_ids_logprob": cands,
            "sampling_params": {"max_new_tokens": 0}, "rid": "r1", **ROUTER_FIELDS}
    first = client.post("/generate", json=body)
    assert first.status_code == 200, first.text
    items = first.json()
    assert [i["meta_info"]["prompt_tokens"] for i in items] == [len(p) for p in prompts]
    for item, prompt in zip(items, prompts):
        got = {c: v for v, c, _ in item["meta_info"]["output_token_ids_logits"][0]}
        want = engine.backend.reference_logits(prompt, cands)  # naive full forward
        assert [got[c] for c in cands] == pytest.approx(want, abs=2e-3)
    again = client.post("/generate", json=body).json()
    assert again[0]["meta_info"]["cached_tokens"] >= len(state)  # the state came from cache
    single = client.post("/generate", json={**body, "input_ids": prompts[0]})
    assert isinstance(single.json(), dict) and single.json()["meta_info"]["id"] == "r1"
    bad = client.post("/generate", json={**body, "input_ids": [10**9]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    assert bad.json()["error"]["field"] == "input_ids"
    bad = client.post("/generate", json={**body, "token_ids_logprob": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "token_ids_logprob"


def test_router_forwarded_completion_is_accepted(client):
    # sglang-router 0.3.2 adds these to every /v1/completions body it forwards
    r = client.post("/v1/completions", json={
        "model": "jev-latest", "prompt": "Hello there", "max_tokens": 0, "echo": True,
        "logprobs": 0, "stream": False, "no_stop_trim": False, "ignore_eos": False,
        "skip_special_tokens": True, "return_hidden_states": False})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"]
