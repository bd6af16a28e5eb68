"""A soak: 16 clients send a bounded mix of hostile and ordinary requests to a real
``onepass serve`` (auth on, embedded model) for 60 s on loopback.

Every ordinary request must answer exactly what it answered alone before the soak (decision
probabilities within 1e-4, greedy text identical: the suite runs in float32); a 429 is retried
as the official clients retry it, and at most one ordinary request in 20 needs that; every
hostile one gets a 4xx (or is dropped by its own client on purpose); nothing answers 5xx;
``/health/live`` answers within 1 s throughout; the server's resident memory stays bounded; and
it still answers afterwards. Each hostile shape is one that crashed, froze or starved the server
before (issue 25).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import serve_process

pytestmark = pytest.mark.proof

SECONDS = float(os.environ.get("ONEPASS_SOAK_SECONDS", "60"))
CLIENTS = 16
KEY = "soak-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEALTH_BOUND_S = 1.0
RSS_GROWTH_BOUND = 1536 * 2**20  # bytes over the RSS after warm-up

ORDINARY: dict[str, tuple[str, dict[str, Any]]] = {
    "systemone": ("/v1/systemone", {
        "state": "My parcel is two weeks late and nobody answers my emails.",
        "questions": {
            "late": {"type": "noul", "instructions": "The parcel is late."},
            "team": {"type": "choice", "instructions": "Which team should answer?",
                     "criteria": {"shipping": "parcels", "billing": "money", "tech": None}},
            "anger": {"type": "score", "instructions": "How angry is the customer?",
                      "criteria": ["calm", "annoyed", "furious"]},
        },
    }),
    "chat": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8, "temperature": 0,
    }),
    "decisions": ("/v1/decisions/schema", {
        "context": "Server is down!", "mode": "batch",
        "schema": {"type": "object", "properties": {
            "urgent": {"type": "boolean"}, "team": {"enum": ["ops", "support"]}}},
    }),
}


def _ref_chain(links: int) -> dict[str, Any]:
    defs = {f"d{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def _lark_chain(rules: int) -> str:
    lines = ["start: r0"] + [f"r{i}: \"a\" r{i + 1}" for i in range(rules)] + [f"r{rules}: \"a\""]
    return "\n".join(lines)


def _lark_wide(alternatives: int) -> str:
    return "start: " + " | ".join(f'"w{i}x"' for i in range(alternatives))


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, **extra}


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "lookup", "strict": True,
                                             "parameters": parameters}}


def _hostile(listener: str) -> dict[str, Callable[[httpx.Client], httpx.Response | None]]:
    """Each shape: send it, return the response (None when the client drops it on purpose)."""
    big = "1" * 5000

    def post(path: str, body: Any, timeout: float = 30) -> Callable[[httpx.Client], Any]:
        raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return lambda c: c.post(path, content=raw, timeout=timeout,
                                headers={**AUTH, "content-type": "application/json"})

    def dropped(path: str, body: dict[str, Any], after: float) -> Callable[[httpx.Client], Any]:
        def send(c: httpx.Client) -> None:
            with contextlib.suppress(httpx.TimeoutException):
                c.post(path, json=body, headers=AUTH, timeout=after)
        return send

    return {
        "ref_chain": post("/v1/chat/completions", _chat(response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": _ref_chain(1000)}})),
        "lark_chain": post("/v1/chat/completions", _chat(grammar=_lark_chain(3000))),
        "lark_wide": post("/v1/chat/completions", _chat(grammar=_lark_wide(2100))),
        "responses_ref_chain": post("/v1/responses", {"input": "Hi", "max_output_tokens": 4,
                                    "text": {"format": {"type": "json_schema", "name": "x",
                                                        "schema": _ref_chain(1000)}}}),
        "remote_ref": post("/v1/chat/completions", _chat(tool_choice="required", tools=[_tool(
            {"type": "object", "properties": {"q": {"$ref": listener + "/schema.json"}}})])),
        "file_ref": post("/v1/chat/completions", _chat(tool_choice="required", tools=[_tool(
            {"type": "object", "properties": {"q": {"$ref": "file:///etc/hostname"}}})])),
        "huge_int": post("/v1/systemone", '{"state": "x", "temperature": ' + big
                         + ', "questions": {"a": {"type": "noul", "instructions": "x"}}}'),
        "huge_logit_bias": post("/v1/chat/completions",
                                '{"messages": [{"role": "user", "content": "hi"}], '
                                '"max_tokens": 2, "logit_bias": {"' + big + '": 1}}'),
        "surrogate": post("/v1/systemone", '{"state": "x\\ud800", "questions": {"a": '
                          '{"type": "noul", "instructions": "x"}}}'),
        "surrogate_chat": post("/v1/chat/completions", '{"messages": [{"role": "user", '
                               '"content": "\\udfff"}], "max_tokens": 2}'),
        "generate_flood": post("/generate", {"input_ids": [[1]] * 5000,
                                             "token_ids_logprob": [330, 389],
                                             "sampling_params": {"max_new_tokens": 0}}),
        "generate_wide": post("/generate", {"input_ids": [[1, 2, 3]] * 200,
                                            "token_ids_logprob": list(range(20000)),
                                            "sampling_params": {"max_new_tokens": 0}}),
        "input_items_limit": lambda c: c.get("/v1/responses/resp_x/input_items?limit=²",
                                             headers=AUTH, timeout=30),
        "n8_long": dropped("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Write a long story."}], "n": 8,
            "max_tokens": 8150, "temperature": 1.0}, after=2.0),
        "embeddings_flood": dropped("/v1/embeddings", {"input": ["word " * 2000] * 40},
                                    after=2.0),
    }


class _Listener(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        _Listener.hits.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _half_headers(port: int, hold: float) -> None:
    """A connection that sends half of its request head and waits (slowloris)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 5) as s:
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Ty")
        s.settimeout(hold)
        with contextlib.suppress(OSError):
            s.recv(1)  # the server may close it first: that is the point


def _ordinary(c: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """An ordinary request as the official clients send it: a 429 is retried (twice) after the
    server's retry-after-ms, as typesafe-sdk and openai do; the retries are counted."""
    for attempt in range(3):
        r = c.post(path, json=body, headers=AUTH, timeout=60)
        if r.status_code != 429 or attempt == 2:
            return r
        _RETRIES.append(path)
        time.sleep(int(r.headers.get("retry-after-ms", "1000")) / 1000)
    raise AssertionError("unreachable")


_RETRIES: list[str] = []


def _answers_match(kind: str, got: dict[str, Any], want: dict[str, Any]) -> str | None:
    if kind == "chat":
        a, b = got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]
        return None if a == b else f"greedy text {a!r} != {b!r}"
    if kind == "decisions":
        if got["value"] != want["value"]:
            return f"{got['value']} != {want['value']}"
        return None
    for name, ref in want["answers"].items():
        ans = got["answers"][name]
        for key in ("noul", "score", "choice"):
            if key in ref and (ans[key] != ref[key] if key == "choice"
                               else abs(ans[key] - ref[key]) > 1e-4):
                return f"{name}.{key} {ans[key]} != {ref[key]}"
        for label, p in (ref.get("probabilities") or {}).items():
            if abs(ans["probabilities"][label] - p) > 1e-4:
                return f"{name} P({label}) {ans['probabilities'][label]} != {p}"
    return None


def test_soak_hostile_and_ordinary_clients(tmp_path: Path) -> None:
    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    listener_url = f"http://127.0.0.1:{listener.server_address[1]}"
    hostile = _hostile(listener_url)
    env = {"ONEPASS_API_KEY": KEY}
    with serve_process(["--threads", "1", "--log-level", "warning"], tmp_path / "server.log",
                       env=env) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        with httpx.Client(base_url=url) as c:
            reference = {}
            for kind, (path, body) in ORDINARY.items():
                r = c.post(path, json=body, headers=AUTH, timeout=60)
                assert r.status_code == 200, (kind, r.text)
                reference[kind] = r.json()
        baseline_rss = _rss(proc.pid)

        stop = time.monotonic() + SECONDS
        failures: list[str] = []
        counts: Counter[str] = Counter()
        statuses: Counter[str] = Counter()
        health_worst = [0.0]
        rss_peak = [baseline_rss]
        lock = threading.Lock()

        def fail(message: str) -> None:
            with lock:
                failures.append(message)

        def client(seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(base_url=url) as c:
                while time.monotonic() < stop and proc.poll() is None:
                    if seed % 8 == 7:  # two clients hold half-open connections
                        _half_headers(port, hold=5.0)
                        with lock:
                            counts["half_headers"] += 1
                        continue
                    if rng.random() < 0.5:
                        kind = rng.choice(sorted(ORDINARY))
                        path, body = ORDINARY[kind]
                        try:
                            r = _ordinary(c, path, body)
                        except httpx.HTTPError as exc:
                            fail(f"ordinary {kind}: {exc!r}")
                            continue
                        with lock:
                            counts[kind] += 1
                            statuses[f"{kind}:{r.status_code}"] += 1
                        if r.status_code != 200:
                            fail(f"ordinary {kind}: {r.status_code} {r.text[:300]}")
                        elif (why := _answers_match(kind, r.json(), reference[kind])):
                            fail(f"ordinary {kind}: {why}")
                    else:
                        kind = rng.choice(sorted(hostile))
                        try:
                            r = hostile[kind](c)
                        except httpx.HTTPError as exc:
                            fail(f"hostile {kind}: {exc!r}")
                            continue
                        with lock:
                            counts[kind] += 1
                            if r is not None:
                                statuses[f"{kind}:{r.status_code}"] += 1
                        if r is not None and not 400 <= r.status_code < 500:
                            fail(f"hostile {kind}: {r.status_code} {r.text[:300]}")

        def watch() -> None:
            with httpx.Client(base_url=url) as c:
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    try:
                        c.get("/health/live", timeout=5).raise_for_status()
                    except httpx.HTTPError as exc:
                        fail(f"/health/live: {exc!r}")
                    health_worst[0] = max(health_worst[0], time.monotonic() - t0)
                    if proc.poll() is not None:
                        fail(f"server exited with {proc.returncode}")
                        return
                    rss_peak[0] = max(rss_peak[0], _rss(proc.pid))
                    time.sleep(0.25)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 180)
        listener.shutdown()

        ordinary = sum(counts[k] for k in ORDINARY)
        summary = (f"counts {dict(counts)}; statuses {dict(statuses)}; 429s retried "
                   f"{len(_RETRIES)}; /health/live worst "
                   f"{health_worst[0]:.2f} s; RSS {baseline_rss / 2**20:.0f} -> peak "
                   f"{rss_peak[0] / 2**20:.0f} MiB")
        print(summary)
        assert not any(t.is_alive() for t in threads), "a client never finished: " + summary
        assert not failures, f"{len(failures)} failures, first: {failures[:5]}; {summary}"
        assert proc.poll() is None, "the server died: " + summary
        assert ordinary >= 20, "too few ordinary requests ran: " + summary
        assert len(_RETRIES) <= ordinary // 20, "ordinary requests were crowded out: " + summary
        assert health_worst[0] < HEALTH_BOUND_S, summary
        assert rss_peak[0] - baseline_rss < RSS_GROWTH_BOUND, summary
        assert not _Listener.hits, f"the server fetched {_Listener.hits}"
        with httpx.Client(base_url=url) as c:  # and it still answers, the same
            kind = "systemone"
            r = c.post(ORDINARY[kind][0], json=ORDINARY[kind][1], headers=AUTH, timeout=60)
            assert r.status_code == 200 and not _answers_match(kind, r.json(), reference[kind])
