"""`onepass serve` as a real process on a loopback port, driven by the official client
(typesafe-sdk 0.7.5, default settings: zstd on, model jev-latest) and by `jevbench check`,
both unmodified except for the base URL. Also: flag/env precedence, auth and the graceful
drain on SIGTERM, on a second server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ts = pytest.importorskip("typesafe_sdk")
pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parent.parent
STATE = {"ticket": 4812, "text": "My parcel arrived with a crushed box and a broken mug inside.",
         "customer": {"tier": "gold", "orders": 12},
         "history": ["2024-03-02: order placed, two mugs and a teapot",
                     "2024-03-04: shipped with the standard carrier",
                     "2024-03-09: delivered three days late, box crushed on one side",
                     "2024-03-09: customer sent photos of the broken mug and asked for help"]}
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `onepass serve` subprocess; its JSON log lines are kept for assertions."""

    def __init__(self, log_path: Path, args: list[str], env: dict[str, str] | None = None):
        self.log_path = log_path
        self.port = int(args[args.index("--port") + 1]) if "--port" in args else None
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log_file = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onepass.cli", "serve", *args],
            cwd=ROOT, env=full_env, stdout=self.log_file, stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready:\n{self.log_path.read_text()[-3000:]}")

    def logs(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def access(self, request_id: str) -> dict:
        """The access-log line of a request (written just after its response is sent)."""
        deadline = time.monotonic() + 10
        while True:
            found = [r for r in self.logs() if r.get("request_id") == request_id
                     and r.get("logger") == "onepass.access"]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(found) == 1, found
        return found[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_file.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # One forward thread: this suite runs on small shared CI machines, where torch's default
    # (a thread per core) competing with other busy processes makes forwards several times
    # slower and would push answers past the client's 10 s timeout.
    srv = Server(tmp_path_factory.mktemp("serve") / "server.log",
                 ["--port", str(free_port()), "--log-level", "info", "--threads", "1"])
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture()
def client(server):
    with ts.TypeSafeClient(api_key="local", base_url=server.url) as c:
        yield c


def status_count(server: Server, status: int) -> float:
    text = httpx.get(server.url + "/metrics").text
    pattern = (r'onepass_http_requests_total\{method="POST",route="/v1/systemone",'
               rf'status="{status}"\}} (\S+)')
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


def test_sdk_round_trips_every_question_type(client, server):
    r = client.system_one(
        state=STATE,
        questions={
            "damaged": ts.Noul(instructions="The item arrived damaged."),
            "labelled": ts.Noul(instructions="A refund is due.",
                                criteria={"true": "Refund the customer", "false": "No refund"}),
            "criteria_only": ts.Noul(criteria={"true": "The customer is angry"}),
            "dept": ts.Choice(instructions="Which team handles it?",
                              criteria={"billing": "payments", "logistics": "shipping damage",
                                        "support": None}),
            "single": ts.Choice(instructions="Pick the only option", criteria={"only": None}),
            "urgency": ts.Score(instructions="How urgent is it?",
                                criteria=["routine", "urgent", {"level": "emergency"}]),
            "raw_dict": {"type": "noul", "instructions": {"claim": "the mug is broken"}},
        },
    )
    assert r.model == "smollm2-135m-instruct"
    assert set(r.answers) == {"damaged", "labelled", "criteria_only", "dept", "single",
                              "urgency", "raw_dict"}
    assert set(r.nouls) == {"damaged", "labelled", "criteria_only", "raw_dict"}
    assert all(0.0 <= a.noul <= 1.0 for a in r.nouls.values())
    dept = r.choices["dept"]
    assert dept.choice in {"billing", "logistics", "support"}
    assert abs(sum(dept.probabilities.values()) - 1) < 1e-6
    assert r.choices["single"].choice == "only" and r.choices["single"].confidence == 1.0
    urgency = r.scores["urgency"]
    assert urgency.legend == {0: "routine", 1: "urgent", 2: {"level": "emergency"}}
    assert set(urgency.probabilities) == {0, 1, 2} and 0 <= urgency.score <= 2
    assert isinstance(r.usage.input_tokens, int) and r.usage.input_tokens > 0
    assert r.usage.output_tokens == 6  # the 1-option choice needs no forward position
    # request_id is the server's id for this request, and the body went out zstd-compressed
    line = server.access(r.request_id)
    assert line["status"] == 200 and line["encoding"] == "zstd"
    assert line["decoded_bytes"] > line["body_bytes"]


def test_sdk_large_request(client, server):
    paragraphs = [f"Paragraph {i}: the customer reports that parcel {1000 + i} was late and "
                  "the packaging was torn." for i in range(12)]
    state = {"history": paragraphs, "note": "Escalated twice."}
    questions = {f"q{i}": ts.Noul(instructions=f"Parcel {1000 + i} was late.") for i in range(12)}
    questions["team"] = ts.Choice(instructions="Team?",
                                  criteria={f"team_{c}": None for c in "abcdefghij"})
    r = client.system_one(state=state, questions=questions)
    assert len(r.answers) == 13 and len(r.choices["team"].probabilities) == 10
    line = server.access(r.request_id)
    assert line["encoding"] == "zstd" and line["decoded_bytes"] > 2000


def test_sdk_models_list(client):
    models = client.models.list()
    names = [m.name for m in models.models]
    assert names == ["smollm2-135m-instruct", "jev-latest"]
    assert all(m.release_date and m.description for m in models.models)


def test_sdk_error_classes_and_no_retries_of_4xx(client, server):
    cases = [
        # (expected class, status, call kwargs, message fragment)
        (ts.TypeSafeUnprocessableEntityError, 422,
         {"questions": {"a": ts.Score(instructions="x", criteria=[str(i) for i in range(11)])}},
         "questions.a.criteria: expected 1 to 10 levels, got 11"),
        (ts.TypeSafeBadRequestError, 400,
         {"questions": {"a": {"type": "noul", "criteria": {"maybe": "x"}}}},
         "questions.a.criteria"),
        (ts.TypeSafeBadRequestError, 400, {"questions": {"a": ts.Box(instructions="the mug")}},
         "need a vision-language model"),
        (ts.TypeSafeBadRequestError, 400,
         {"state": ts.Image(PNG), "questions": {"a": ts.Noul(instructions="x")}},
         "image assets"),
        (ts.TypeSafeNotFoundError, 404,
         {"model": "gpt-4o", "questions": {"a": ts.Noul(instructions="x")}},
         "unknown model 'gpt-4o'"),
    ]
    for cls, status, kwargs, fragment in cases:
        before = status_count(server, status)
        with pytest.raises(cls) as err:
            client.system_one(**{"state": "A short note.", **kwargs})
        assert err.value.status == status
        assert fragment in str(err.value), str(err.value)
        assert err.value.request_id and err.value.request_id.startswith("req_")
        assert status_count(server, status) == before + 1, "a 4xx was retried"
    # a good request still works afterwards
    assert client.system_one(state="hi", questions={"a": ts.Noul(instructions="hi")}).answers


def test_async_sdk(server):
    async def go():
        async with ts.AsyncTypeSafeClient(api_key="local", base_url=server.url) as c:
            r1, r2 = await asyncio.gather(
                c.system_one(state=STATE, questions={
                    "n": ts.Noul(instructions="The box was damaged."),
                    "c": ts.Choice(instructions="Tone?", criteria={"calm": None, "angry": None}),
                    "s": ts.Score(instructions="Severity", criteria=["low", "high"])}),
                c.system_one(state=STATE, questions={"n": ts.Noul(instructions="It is late.")}),
            )
            models = await c.models.list()
            with pytest.raises(ts.TypeSafeUnprocessableEntityError):
                await c.system_one(state="x", questions={"a": {"type": "noul", "instructions": 3}})
            return r1, r2, models

    r1, r2, models = asyncio.run(go())
    assert set(r1.answers) == {"n", "c", "s"} and set(r2.answers) == {"n"}
    assert r1.request_id != r2.request_id
    assert models.models[1].name == "jev-latest"


def test_jevbench_check(server):
    jevbench = Path(sys.executable).parent / "jevbench"
    out = subprocess.run(
        [str(jevbench), "check", "--url", server.url + "/v1/systemone", "--model", "jev-latest"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "jevbench check: OK" in out.stdout


def test_flags_env_auth_and_graceful_drain(tmp_path):
    """Second server: port from the flag beats ONEPASS_PORT, the API key and the request
    deadline come from the environment; SIGTERM lets an in-flight request finish. The request
    is provably in flight when the signal arrives: its body is held back until the server has
    logged the drain, so it can only be answered after the signal."""
    port = free_port()
    srv = Server(tmp_path / "server.log",
                 ["--port", str(port), "--drain-seconds", "20", "--threads", "1"],
                 env={"ONEPASS_PORT": "1", "ONEPASS_API_KEY": "k-123",
                      "ONEPASS_REQUEST_DEADLINE": "4.5", "ONEPASS_LOG_LEVEL": "info"})
    try:
        srv.wait_ready()
        start = next(r for r in srv.logs() if r.get("msg") == "starting")
        assert start["settings"]["port"] == port and start["settings"]["request_deadline"] == 4.5
        assert start["settings"]["auth"] is True and "k-123" not in srv.log_path.read_text()

        with ts.TypeSafeClient(api_key="wrong", base_url=srv.url) as bad, \
                pytest.raises(ts.TypeSafeAuthenticationError):
            bad.models.list()
        assert httpx.get(srv.url + "/v1/models").status_code == 403

        body = json.dumps({"state": STATE, "questions": {
            f"q{i}": {"type": "noul", "instructions": f"Statement {i} holds."}
            for i in range(6)}}).encode()
        release = threading.Event()
        result: dict = {}

        def held_body():
            yield body[: len(body) // 2]
            release.wait(30)  # the rest only once the server is draining
            yield body[len(body) // 2:]

        def in_flight_request():
            try:
                result["response"] = httpx.post(
                    srv.url + "/v1/systemone", content=held_body(), timeout=60,
                    headers={"authorization": "Bearer k-123",
                             "content-type": "application/json"})
            except Exception as exc:  # reported below
                result["error"] = exc

        t = threading.Thread(target=in_flight_request)
        t.start()
        try:
            deadline = time.monotonic() + 20
            while httpx.get(srv.url + "/health").json().get("in_flight", 0) < 1:
                assert time.monotonic() < deadline, "the request never arrived"
                time.sleep(0.02)
            srv.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 20
            while not (draining := [r for r in srv.logs()
                                    if r.get("msg", "").startswith("draining")]):
                assert time.monotonic() < deadline, "the server never started draining"
                time.sleep(0.02)
        finally:
            release.set()
        t.join(60)
        # the server counted the request as in flight when the signal arrived ...
        assert draining[0]["in_flight"] == 1, draining
        # ... and answered it in full afterwards
        assert "error" not in result, result.get("error")
        response = result["response"]
        assert response.status_code == 200, response.text
        assert len(response.json()["answers"]) == 6
        assert srv.proc.wait(40) == 0
        logs = srv.logs()
        done = next(r for r in logs if r.get("msg") == "shutdown complete")
        assert done["abandoned"] == 0 and done["answered"] >= 1
    finally:
        srv.stop()
