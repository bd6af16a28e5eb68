"""Embeddings through a decoder and prompt scoring as reading tasks of the step scheduler: read
in prompt chunks between everyone else's tokens, equal to one whole naive forward, stopped when
the client leaves, bounded per request (issue 25, item 7)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch

from onepass.generate.sampling import SamplingParams
from onepass.generate.scheduler import GenerationScheduler, ReadCancelled

GREEDY = SamplingParams(temperature=0.0)


def _naive_embedding(backend, ids: list[int]) -> list[float]:
    """The mean of one plain forward's final hidden states (a leading BOS left out)."""
    with torch.inference_mode():
        hidden = backend.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    if backend.bos_id is not None and ids[0] == backend.bos_id and len(ids) > 1:
        hidden = hidden[1:]
    return hidden.float().mean(0).tolist()


def _naive_logprobs(backend, ids: list[int], top: int):
    with torch.inference_mode():
        logp = backend.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logp, -1)
    chosen = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    return chosen, torch.topk(logp, top).indices.tolist()


def _chat(engine, text: str) -> list[int]:
    return engine.generator.chat_prompt([{"role": "user", "content": text}])


def _start_reading(scheduler, reader, stop):
    """``scheduler.read`` on a thread; returns the box its result or error lands in."""
    box: dict = {}

    def run():
        try:
            box["result"] = scheduler.read(reader, stop)
        except Exception as exc:
            box["error"] = exc
        box["done"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    box["thread"] = thread
    return box


def test_chunked_readings_equal_a_naive_forward_while_a_chat_runs(engine):
    """Embeddings of inputs that cross chunk boundaries (5-token steps, packed beside a running
    chat and each other) and prompt scoring equal one whole plain forward within 1e-4."""
    backend = engine.backend
    scheduler = GenerationScheduler(backend, step_tokens=5, arena_rows=2048)
    try:
        texts = ["The cat sat on the mat.", "A cat was sitting on the rug, quietly, all day "
                 "long while the rain fell outside.", "Stocks fell."]
        inputs = [backend.encode(t) for t in texts]
        scored = backend.encode("The quick brown fox jumps over the lazy dog near the river "
                                "bank, and then it runs home.")
        chat = scheduler.submit(_chat(engine, "Write a long essay about rivers."), GREEDY, 40)
        embeddings = _start_reading(scheduler, backend.embedding_reader(inputs), None)
        scoring = _start_reading(scheduler, backend.scoring_reader(scored, 3), None)
        for box in (embeddings, scoring):
            box["thread"].join(120)
            assert "result" in box, box
        events = list(chat)
        assert events[-1].reason == "length"  # the chat ran beside them throughout

        assert sum(len(ids) > 5 for ids in inputs) == 2  # read in several chunks
        for ids, got in zip(inputs, embeddings["result"]):
            assert got == pytest.approx(_naive_embedding(backend, ids), abs=1e-4)
            # and the whole-forward path (the CLI's) agrees too
            assert got == pytest.approx(backend.embed(ids), abs=1e-4)
        chosen, best = _naive_logprobs(backend, scored, 3)
        got = scoring["result"]
        assert len(got) == len(scored) - 1
        assert [lp for lp, _ in got] == pytest.approx(chosen, abs=1e-4)
        assert [[t for t, _ in alts] for _, alts in got] == best
        whole = backend.prompt_logprobs(scored, 3)
        assert [v for _, alts in got for _, v in alts] == pytest.approx(
            [v for _, alts in whole for _, v in alts], abs=1e-4)
        assert scheduler.arena.free_rows == scheduler.arena.capacity  # every row released
    finally:
        scheduler.close()


def _per_token(scheduler, prompt: list[int], n: int) -> float:
    """Seconds per generated token, from submission to the last token (waiting included)."""
    start = time.monotonic()
    events = list(scheduler.submit(prompt, GREEDY, n))
    assert events[-1].completion_tokens == n
    return (time.monotonic() - start) / n


def test_a_chat_keeps_its_pace_while_a_long_prompt_is_scored_then_cancelled(engine):
    """Before: scoring ran as one whole forward holding the model lock, so a chat waited for
    all of it (measured here: a chat submitted just after a 6,000-token scoring call took
    9.0 s per token instead of 0.20 s alone: 46x). Now the scoring is chunked between the
    chat's tokens, and cancelling it stops its chunks at the next step."""
    backend = engine.backend
    # short steps: on a CPU a step's cost grows with its tokens (a GPU's hardly does)
    scheduler = GenerationScheduler(backend, step_tokens=4, arena_rows=4096)
    try:
        prompt = _chat(engine, "Name three colors.")
        _per_token(scheduler, prompt, 4)  # warm
        alone = _per_token(scheduler, prompt, 12)
        long = backend.encode("word " * 2000)[:1000]
        stop = threading.Event()
        reader = backend.scoring_reader(long, 0)
        box = _start_reading(scheduler, reader, stop)
        while not reader.result():  # its first chunk is read
            time.sleep(0.01)
        # the better of two runs: a neighbour's burst on a shared CPU is no stall of ours
        loaded = min(_per_token(scheduler, prompt, 12) for _ in range(2))
        assert "done" not in box  # the scoring was still running throughout
        stop.set()
        box["thread"].join(30)
        assert isinstance(box.get("error"), ReadCancelled)
        after = scheduler.tokens
        time.sleep(1.0)
        assert scheduler.tokens == after  # no more chunks for it
        assert len(reader.result()) < len(long) // 2  # it stopped far from the end
        assert scheduler.arena.free_rows == scheduler.arena.capacity
        alone = (alone + _per_token(scheduler, prompt, 12)) / 2  # the shared CPU drifts
        assert loaded < 3 * alone, (loaded, alone)
    finally:
        scheduler.close()


@pytest.fixture(scope="module")
def small_engine(engine):
    """The session model behind its own engine: short steps and a 600-token input limit, so
    the route tests are fast (one model in memory)."""
    from onepass import DecisionEngine

    small = DecisionEngine(engine.backend, max_input_tokens=600, served_name="small")
    small.generation_options = {"step_tokens": 32}
    yield small
    small.generator.scheduler.close()


def _asgi(app, path: str, body: dict, disconnect: threading.Event):
    """POST ``body`` to ``app`` directly; the client goes away once ``disconnect`` is set."""
    sent: list = []

    async def call():
        parts = [{"type": "http.request", "body": json.dumps(body).encode(),
                  "more_body": False}]

        async def receive():
            if parts:
                return parts.pop()
            while not disconnect.is_set():
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await app(scope, receive, send)

    thread = threading.Thread(target=lambda: asyncio.run(call()), daemon=True)
    thread.start()
    return thread, sent


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/embeddings", {"input": ["word " * 250, "word " * 250]}),
    ("/v1/completions", {"prompt": "word " * 500, "max_tokens": 0, "echo": True,
                         "logprobs": 0}),
])
def test_a_client_that_leaves_stops_its_reading(small_engine, path, body):
    """Before: the whole forward ran on after the client left (never through the steps);
    now the scheduler does no more work for it after the disconnect."""
    from onepass.server.app import create_app
    from onepass.server.settings import ServerSettings

    app = create_app(small_engine, ServerSettings())
    scheduler = small_engine.generator.scheduler
    from fastapi.testclient import TestClient

    with TestClient(app):
        begin = scheduler.tokens
        gone = threading.Event()
        thread, sent = _asgi(app, path, body, gone)
        deadline = time.monotonic() + 60
        while scheduler.tokens < begin + 64:  # two chunks read
            assert time.monotonic() < deadline, "the reading never ran in the steps"
            time.sleep(0.01)
        gone.set()
        thread.join(30)
        while scheduler._readings:  # the step in flight ends; the next drops the reading
            assert time.monotonic() < deadline, "the reading was never dropped"
            time.sleep(0.01)
        stopped = scheduler.tokens
        time.sleep(1.0)
        assert scheduler.tokens == stopped, "chunks kept running after the client left"
        assert stopped - begin < 400  # far from the ~500 tokens it asked for
        assert not any(m.get("status") == 200 for m in sent)
        assert not scheduler._readings and not scheduler._readings_waiting
        assert scheduler.arena.free_rows == scheduler.arena.capacity


def test_readings_are_bounded_per_request_naming_the_field(small_engine):
    from fastapi.testclient import TestClient

    from onepass.server.app import create_app
    from onepass.server.settings import ServerSettings

    with TestClient(create_app(small_engine, ServerSettings())) as client:
        ok = client.post("/v1/embeddings", json={"input": ["word " * 100, "word " * 100]})
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["prompt_tokens"] <= 600
        # every input fits alone; together they are over max_input_tokens: 413, nothing read
        before = small_engine.generator.scheduler.tokens
        over = client.post("/v1/embeddings", json={"input": ["word " * 250] * 3})
        assert over.status_code == 413, over.text
        error = over.json()["error"]
        assert error["param"] == "input" and error["code"] == "max_tokens_exceeded"
        assert "over the limit of 600 (max_input_tokens)" in error["message"]
        assert small_engine.generator.scheduler.tokens == before
        alone = client.post("/v1/embeddings", json={"input": ["x", "word " * 700]})
        assert alone.status_code == 413 and alone.json()["error"]["param"] == "input[1]"
        many = client.post("/v1/embeddings", json={"input": ["x"] * 129})
        assert many.status_code == 400 and many.json()["error"]["param"] == "input"
        scoring = client.post("/v1/completions", json={
            "prompt": "word " * 700, "max_tokens": 0, "echo": True, "logprobs": 0})
        assert scoring.status_code == 413 and scoring.json()["error"]["param"] == "prompt"
