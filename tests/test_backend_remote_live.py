"""Real engines as remote backends, started by the tests on loopback: a `onepass serve` worker
and llama-cpp-python's server (``python -m llama_cpp.server``) on the embedded GGUF.

System One answers through them agree with the in-process torch backend within the llamacpp
bounds; a killed engine gives 503 (clear message, retry-after) and the front-end recovers when
the engine is back. ``ONEPASS_REMOTE_ENGINE``/``ONEPASS_REMOTE_URL`` (scripts/gpu_check.sh)
also run the agreement test against an engine started elsewhere (vLLM, SGLang on a GPU).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import free_port, serve

from onepass.backends.remote import EngineError, RemoteBackend
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


@contextlib.contextmanager
def llama_cpp_server(port: int, log: Path) -> Iterator[subprocess.Popen]:
    from onepass.backends.llamacpp import gguf_path

    path, _ = gguf_path(None)
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host",
             "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
             "--logits_all", "true", "--verbose", "false"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server not ready:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def reference(engine) -> list[list[float]]:
    return _distributions(engine)


def test_onepass_worker_as_remote_engine(engine, reference, tmp_path):
    with serve([], tmp_path / "worker.log") as url:
        remote = RemoteBackend("onepass", url, engine.backend.tokenizer, name=engine.served_name)
        front = DecisionEngine(remote)
        agree, tv = _agreement(_distributions(front), reference)
        print(f"onepass worker vs in-process: agreement {agree:.3f}, mean TV {tv:.5f}")
        # the same model, but the worker's echo path projects logprobs through the model's own
        # head (bfloat16 on a CPU with BF16: logits rounded to ~3 digits), the fast path in
        # float32: measured TV 0.024
        assert agree >= 0.95 and tv <= 0.05
        assert remote.health()[0]
    assert not remote.health()[0]  # the worker is gone: /health-style probe says so
    with pytest.raises(EngineError) as info:
        front.answer(REQUESTS[0])
    assert info.value.status == 503 and "unreachable" in info.value.message


def test_llama_cpp_server_as_remote_engine_kill_and_recover(engine, reference, tmp_path):
    pytest.importorskip("llama_cpp.server", reason="pip install 'onepass[gguf]'")
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with llama_cpp_server(port, tmp_path / "llama.log"):
        remote = RemoteBackend("llama-cpp-python", url, engine.backend.tokenizer,
                               name=engine.served_name)
        front = DecisionEngine(remote)
        agree, tv = _agreement(_distributions(front), reference)
        print(f"llama-cpp-python server vs torch: agreement {agree:.3f}, mean TV {tv:.4f}")
        assert agree >= 0.95 and tv <= 0.05
    app = create_app(front, ServerSettings())
    with TestClient(app) as client:
        down = client.post("/v1/systemone", json=REQUESTS[1])
        assert down.status_code == 503, down.text
        assert "unreachable" in down.json()["error"]["message"]
        assert down.json()["error"]["type"] == "engine_unavailable"
        assert int(down.headers["retry-after"]) >= 1
        with llama_cpp_server(port, tmp_path / "llama.log"):
            back = client.post("/v1/systemone", json=REQUESTS[1])
            assert back.status_code == 200, back.text
            assert set(back.json()["answers"]) == {"login", "team"}


@pytest.mark.skipif(not os.environ.get("ONEPASS_REMOTE_URL"),
                    reason="set ONEPASS_REMOTE_ENGINE/URL/MODEL (scripts/gpu_check.sh)")
def test_external_engine_agrees(engine, reference):
    remote = RemoteBackend(os.environ["ONEPASS_REMOTE_ENGINE"], os.environ["ONEPASS_REMOTE_URL"],
                           engine.backend.tokenizer, name=engine.served_name,
                           model=os.environ.get("ONEPASS_REMOTE_MODEL"))
    agree, tv = _agreement(_distributions(DecisionEngine(remote)), reference)
    print(f"{remote.engine} vs torch: agreement {agree:.3f}, mean TV {tv:.4f}")
    assert agree >= 0.95 and tv <= 0.05
