"""A real engine as a remote backend, started by the test on loopback: a `onepass serve` worker
on the embedded model.

System One answers through them agree with the in-process torch backend within the llamacpp
bounds; a killed engine gives 503 (clear message, retry-after) and the front-end recovers when
the engine is back. ``ONEPASS_REMOTE_ENGINE``/``ONEPASS_REMOTE_URL`` (scripts/gpu_check.sh)
also run the agreement test against an engine started elsewhere (vLLM, SGLang on a GPU).
"""

from __future__ import annotations

import os

import pytest
from server_process import free_port, serve

from onepass.backends.remote import RemoteBackend
from onepass.engine import DecisionEngine

REQUESTS = [
    {"state": {"ticket": "My parcel arrived broken and two weeks late."},
     "questions": {
         "angry": {"type": "noul", "instructions": "The customer is upset."},
         "topic": {"type": "choice", "instructions": "What is the ticket about?",
                   "criteria": {"delivery": None, "billing": None, "login": None}},
         "severity": {"type": "score", "instructions": "How severe is it?",
                      "criteria": ["minor", "moderate", "severe"]}}},
    {"state": "I cannot log in since the update; the password reset mail never comes.",
     "questions": {
         "login": {"type": "noul", "instructions": "This is a login problem."},
         "team": {"type": "choice", "instructions": "Which team?",
                  "criteria": {"accounts": None, "shipping": None}}}},
]


def _distributions(engine: DecisionEngine) -> list[list[float]]:
    out = []
    for request in REQUESTS:
        for a in engine.answer(request)["answers"].values():
            out.append([a["noul"], 1 - a["noul"]] if a["type"] == "noul"
                       else list(a["probabilities"].values()))
    return out


def _agreement(ours: list[list[float]], theirs: list[list[float]]) -> tuple[float, float]:
    agree = sum(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
                for a, b in zip(ours, theirs)) / len(ours)
    tv = sum(0.5 * sum(abs(x - y) for x, y in zip(a, b)) for a, b in zip(ours, theirs)) / len(ours)
    return agree, tv


@pytest.fixture(scope="module")
def reference(engine) -> list[list[float]]:
    return _distributions(engine)


def test_onepass_worker_as_remote_engine_kill_and_recover(engine, reference, tmp_path):
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    port, log = free_port(), tmp_path / "worker.log"
    with serve([], log, port=port) as url:
        remote = RemoteBackend("onepass", url, engine.backend.tokenizer, name=engine.served_name)
        front = DecisionEngine(remote)
        agree, tv = _agreement(_distributions(front), reference)
        print(f"onepass worker vs in-process: agreement {agree:.3f}, mean TV {tv:.5f}")
        # the same model and the same packed fast path (the worker's POST /generate), float32
        assert agree >= 0.95 and tv <= 0.05
        assert remote.health()[0]
    assert not remote.health()[0]  # the worker is gone: /health-style probe says so
    app = create_app(front, ServerSettings())
    with TestClient(app) as client:
        down = client.post("/v1/systemone", json=REQUESTS[1])
        assert down.status_code == 503, down.text
        assert "unreachable" in down.json()["error"]["message"]
        assert down.json()["error"]["type"] == "engine_unavailable"
        assert int(down.headers["retry-after"]) >= 1
        assert client.get("/health").status_code == 503
        with serve([], log, port=port):  # the engine is back: so is the front-end
            back = client.post("/v1/systemone", json=REQUESTS[1])
            assert back.status_code == 200, back.text
            assert set(back.json()["answers"]) == set(REQUESTS[1]["questions"])
            assert client.get("/health").status_code == 200


@pytest.mark.skipif(not os.environ.get("ONEPASS_REMOTE_URL"),
                    reason="set ONEPASS_REMOTE_ENGINE/URL/MODEL (scripts/gpu_check.sh)")
def test_external_engine_agrees(engine, reference):
    remote = RemoteBackend(os.environ["ONEPASS_REMOTE_ENGINE"], os.environ["ONEPASS_REMOTE_URL"],
                           engine.backend.tokenizer, name=engine.served_name,
                           model=os.environ.get("ONEPASS_REMOTE_MODEL"))
    agree, tv = _agreement(_distributions(DecisionEngine(remote)), reference)
    print(f"{remote.engine} vs torch: agreement {agree:.3f}, mean TV {tv:.4f}")
    assert agree >= 0.95 and tv <= 0.05
