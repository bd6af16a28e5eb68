"""No request may hold the server (issue 25, items 5 and 6), against the real embedded model
on a real loopback server (uvicorn in this process, so a client can disconnect and the
scheduler can be read): ``/generate`` bodies are bounded; one request gets a bounded share of
the generation slots and of the key/value arena; deadlines hold until the answer; clients
that leave also leave the waiting lines; generation has a queue deadline."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from onepass.server import ServerSettings, create_app  # noqa: E402
from onepass.server.runtime import resident_bytes  # noqa: E402

DECISION = {"state": "Hello! How are you today?",
            "questions": {"greeting": {"type": "noul", "instructions": "The text is a greeting."}}}


def chat(max_tokens: int, n: int = 1, stream: bool = False) -> dict:
    """A greedy chat of 36 prompt tokens; a long one (``max_tokens`` over 3) runs to its
    limit (``ignore_eos``), so it holds its slot and rows until its client leaves."""
    return {"messages": [{"role": "user", "content": "Tell me a long story."}], "n": n,
            "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "ignore_eos": max_tokens > 3}


@contextlib.contextmanager
def live(app) -> Iterator[str]:
    """``app`` on a free loopback port, served by uvicorn on a thread of this process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with live(create_app(engine, ServerSettings())) as u:
        yield u


@pytest.fixture(scope="module")
def quick(engine) -> Iterator[str]:
    """A server whose requests may wait one second for the model."""
    with live(create_app(engine, ServerSettings(request_deadline=1.0))) as u:
        yield u


@pytest.fixture
def steps(engine):
    """The model's step scheduler, idle before and after the test."""
    sched = engine.generator.scheduler
    yield sched
    settle(sched)


def settle(sched, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while sched.active or sched.waiting or sched.decisions_waiting:
        assert time.monotonic() < deadline, "the scheduler did not drain"
        time.sleep(0.05)


@contextlib.contextmanager
def generating(url: str, sched, *bodies: dict, running: int = 0) -> Iterator[None]:
    """Each body streamed by its own client until the block ends (then the client leaves);
    the block starts once every one is running (and ``running`` sequences in all)."""
    stop = threading.Event()
    opened = threading.Semaphore(0)

    def hold(body: dict) -> None:
        with httpx.Client(timeout=None) as c, c.stream("POST", url + "/v1/chat/completions",
                                                        json=body) as r:
            assert r.status_code == 200, r.read()
            opened.release()
            for _ in r.iter_bytes():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=hold, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    for _ in bodies:
        assert opened.acquire(timeout=30), "a long generation did not start"
    deadline = time.monotonic() + 30
    while sched.active < max(running, len(bodies)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        settle(sched)


@contextlib.contextmanager
def held_steps(sched) -> Iterator[None]:
    """The step thread stops after its next forward until the block ends: the model is busy
    (something must be generating, so that there is a next forward)."""
    previous = sched.on_step
    gate, inside = threading.Event(), threading.Event()

    def hold(rows: int, tokens: int) -> None:
        if previous is not None:
            previous(rows, tokens)
        inside.set()
        gate.wait(30)

    sched.on_step = hold
    try:
        assert inside.wait(30), "no step ran"
        yield
    finally:
        sched.on_step = previous
        gate.set()


def timed(method, *args, **kwargs) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = method(*args, **kwargs)
    return response, time.monotonic() - start


# ---------------------------------------------------------------------- item 5: /generate


def test_generate_bodies_over_the_limits_are_refused_naming_the_field(url, steps):
    vocab = 49152
    before = resident_bytes()
    wide = {"input_ids": [[1, 504, 3458, i] for i in range(100)],
            "token_ids_logprob": list(range(20_000)), "sampling_params": {"max_new_tokens": 0}}
    r, seconds = timed(httpx.post, url + "/generate", json=wide, timeout=60)
    assert r.status_code == 413, (r.status_code, len(r.content))
    error = r.json()["error"]
    assert error["field"] == "token_ids_logprob" and "max_generate_logits" in error["message"]
    assert seconds < 5
    many = {"input_ids": [[i % vocab] for i in range(5000)], "token_ids_logprob": [330],
            "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(url + "/generate", json=many, timeout=60)
    assert r.status_code == 413, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["field"] == "input_ids" and "max_generate_prompts" in error["message"]
    long = {"input_ids": [[1, i % vocab] * 1000 for i in range(100)],
            "token_ids_logprob": [330], "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(url + "/generate", json=long, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["field"] == "input_ids", r.text[:300]
    assert "max_generate_tokens" in r.json()["error"]["message"]
    grown = (resident_bytes() or 0) - (before or 0)
    assert grown < 100 * 2**20, f"RSS grew {grown / 2**20:.0f} MB"
    # the full vocabulary for one prompt is still a normal request
    one = {"input_ids": [1, 504, 3458], "token_ids_logprob": list(range(vocab)),
           "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(url + "/generate", json=one, timeout=60)
    assert r.status_code == 200 and len(r.json()["meta_info"]["output_token_ids_logits"][0]) \
        == vocab


# ---------------------------------------------------------------------- item 6: monopolisation


def test_an_n8_generation_to_the_end_of_the_context_leaves_room_for_a_chat_and_a_decision(
        url, steps):
    with httpx.Client(base_url=url, timeout=20) as c:
        assert c.post("/v1/chat/completions", json=chat(3)).status_code == 200  # warm
        _, chat_alone = timed(c.post, "/v1/chat/completions", json=chat(3))
        assert c.post("/v1/systemone", json=DECISION).status_code == 200
        _, decision_alone = timed(c.post, "/v1/systemone", json=DECISION)
        with generating(url, steps, chat(8150, n=8, stream=True)):
            assert steps.active <= steps.max_request_sequences < steps.max_sequences
            r, chat_busy = timed(c.post, "/v1/chat/completions", json=chat(3))
            assert r.status_code == 200, r.text
            r, decision_busy = timed(c.post, "/v1/systemone", json=DECISION)
            assert r.status_code == 200, r.text
    # alone: ~0.2 s and ~0.1 s; behind the n=8 request the chat shares each step with it
    assert chat_busy < 10 * chat_alone + 2, (chat_busy, chat_alone)
    assert decision_busy < 2.5, (decision_busy, decision_alone)  # its deadline is 5 s


def test_a_decision_that_cannot_get_model_work_in_time_errors_instead_of_hanging(quick, steps):
    with generating(quick, steps, chat(50, stream=True)), held_steps(steps):
        r, seconds = timed(httpx.post, quick + "/v1/systemone", json=DECISION, timeout=20)
        assert steps.decisions_waiting == 0  # withdrawn from the model's line
    assert r.status_code == 429, (r.status_code, r.text)
    assert r.json()["error"]["type"] == "overloaded" and "deadline" in r.json()["error"][
        "message"]
    assert int(r.headers["retry-after-ms"]) > 0
    assert seconds < 2.5, seconds  # the deadline is 1 s; the model stayed busy


def test_decisions_whose_clients_left_leave_the_step_line(quick, steps):
    with generating(quick, steps, chat(50, stream=True)), held_steps(steps):
        def leave() -> None:
            with contextlib.suppress(httpx.TimeoutException):
                httpx.post(quick + "/v1/systemone", json=DECISION, timeout=0.3)

        clients = [threading.Thread(target=leave) for _ in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        time.sleep(0.3)
        left = steps.decisions_waiting  # the model is still busy: none of them was taken
    assert left == 0, f"{left} decisions of clients that left still wait for the model"


def test_generations_whose_clients_left_leave_the_waiting_line(url, steps):
    hog = chat(2000, n=8, stream=True)
    with generating(url, steps, hog, hog):
        def leave() -> None:
            with httpx.Client(timeout=10) as c, c.stream("POST", url + "/v1/chat/completions",
                                                         json=chat(3, stream=True)) as r:
                assert r.status_code in (200, 429)

        clients = [threading.Thread(target=lambda: [leave() for _ in range(9)])
                   for _ in range(8)]  # 72 clients, over the 64 places of the line
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        time.sleep(0.5)
        with httpx.Client(timeout=10) as c, c.stream("POST", url + "/v1/chat/completions",
                                                     json=chat(3, stream=True)) as r:
            status = r.status_code
            body = r.read() if status != 200 else b""
    assert status == 200, body


def test_a_generation_that_cannot_start_in_time_is_refused_with_retry_after(url, quick, steps):
    hog = chat(2000, n=8, stream=True)
    with generating(url, steps, hog, hog, running=steps.max_sequences):  # every slot busy
        r, seconds = timed(httpx.post, quick + "/v1/chat/completions", json=chat(3),
                           timeout=20)
        streamed = httpx.post(quick + "/v1/chat/completions", json=chat(3, stream=True),
                              timeout=20)  # the 200 is sent: the refusal is the error event
        assert steps.active == steps.max_sequences  # the long ones kept running
    assert streamed.status_code == 200 and b'"type":"overloaded"' in streamed.content.replace(
        b" ", b"") and b"deadline" in streamed.content, streamed.content[-400:]
    assert r.status_code == 429, (r.status_code, r.text)
    assert "deadline" in r.json()["error"]["message"] and int(r.headers["retry-after-ms"]) > 0
    assert seconds < 3, seconds
