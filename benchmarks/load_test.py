"""Load test for `onepass serve`: N concurrent clients for a bounded time, loopback only.

Each client loops: send a System One request (zstd-compressed at 1 KiB or more, as the official
client does), record the outcome, and on 429/503 wait the server's retry-after before the next
one, as the official client would. States come from a fixed pool, so the prefix cache sees
both hits and misses (and evictions when the pool outgrows --session-cache-entries).

It prints, per concurrency level: answered, shed (429/503 carrying retry-after), other
failures by status, p50/p90/p99 latency of answered requests, throughput, and the server's
resident memory (start/peak/end) when it started the server itself. With several levels
(--concurrency 1,8,32) it prints each level's throughput relative to the first.

The run fails (exit 1) on any 5xx other than a 503 with retry-after, on any response that is
neither answered nor shed with retry-after, or on a transport error.

    .venv/bin/python benchmarks/load_test.py --concurrency 1,8,32 --duration 60
    .venv/bin/python benchmarks/load_test.py --url http://127.0.0.1:8080 --concurrency 8

It never asserts timings (machines differ); it prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
import zstandard

ROOT = Path(__file__).resolve().parent.parent

TOPICS = ["a late parcel", "a double charge", "a broken mug", "a password reset",
          "a refund request", "a change of address", "a damaged laptop", "a missing invoice",
          "a cancelled flight", "a noisy neighbour", "a software crash", "a billing dispute"]


STATE_LINES = {"mixed": (2, 8), "short": (3, 4), "long": (19, 22)}  # ~100 / ~512 tokens


def make_states(n: int, size: str = "mixed") -> list[dict]:
    rng = random.Random(7)
    low, high = STATE_LINES[size]
    states = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        lines = [f"Message {k}: customer {1000 + i} writes about {topic}; "
                 f"{rng.choice(['angry', 'calm', 'confused', 'polite'])} tone, "
                 f"order #{rng.randint(10000, 99999)}." for k in range(rng.randint(low, high))]
        states.append({"ticket": 5000 + i, "topic": topic, "thread": lines})
    return states


def make_questions(rng: random.Random) -> dict:
    pool = {
        "refund": {"type": "noul", "instructions": "The customer should get a refund."},
        "angry": {"type": "noul", "instructions": "The customer is angry."},
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "payments and invoices", "logistics": "shipping",
                              "support": "accounts and software", "other": None}},
        "urgency": {"type": "score", "instructions": "How urgent is this?",
                    "criteria": ["routine", "soon", "urgent", "emergency"]},
    }
    keys = rng.sample(sorted(pool), rng.randint(1, 3))
    return {k: pool[k] for k in keys}


def encode(body: dict) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": "Bearer load-test"}
    if len(raw) >= 1024:
        return zstandard.ZstdCompressor().compress(raw), {**headers, "content-encoding": "zstd"}
    return raw, headers


@dataclass
class Result:
    concurrency: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    shed: int = 0
    shed_without_retry_after: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    rss_mb: list[float] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return len(self.latencies)

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    @property
    def throughput(self) -> float:
        return self.answered / self.seconds if self.seconds else 0.0


async def client_loop(client: httpx.AsyncClient, url: str, states: list[dict], seed: int,
                      stop_at: float, budget: list[int], result: Result) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at and budget[0] > 0:
        budget[0] -= 1
        body = {"model": "jev-latest", "state": rng.choice(states),
                "questions": make_questions(rng)}
        content, headers = encode(body)
        start = time.monotonic()
        try:
            r = await client.post(url, content=content, headers=headers)
        except httpx.HTTPError as exc:
            key = f"transport:{exc.__class__.__name__}"
            result.failures[key] = result.failures.get(key, 0) + 1
            await asyncio.sleep(0.5)
            continue
        elapsed = time.monotonic() - start
        if r.status_code == 200:
            answers = r.json().get("answers", {})
            if set(answers) != set(body["questions"]):
                key = "200-wrong-answers"
                result.failures[key] = result.failures.get(key, 0) + 1
            else:
                result.latencies.append(elapsed)
        elif r.status_code in (429, 503):
            wait_ms = r.headers.get("retry-after-ms")
            if wait_ms is None or r.headers.get("retry-after") is None:
                result.shed_without_retry_after += 1
                wait = 1.0
            else:
                result.shed += 1
                wait = float(wait_ms) / 1000
            await asyncio.sleep(min(wait, max(0.0, stop_at - time.monotonic())))
        else:
            key = str(r.status_code)
            result.failures[key] = result.failures.get(key, 0) + 1


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


async def run_level(url: str, concurrency: int, duration: float, max_requests: int,
                    states: list[dict], pid: int | None) -> Result:
    result = Result(concurrency)
    budget = [max_requests]
    stop_at = time.monotonic() + duration
    sampling = True

    def sample() -> None:
        while sampling:
            if pid is not None and (m := rss_mb(pid)) is not None:
                result.rss_mb.append(m)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(30.0)
    start = time.monotonic()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        await asyncio.gather(*(client_loop(client, url, states, seed, stop_at, budget, result)
                               for seed in range(concurrency)))
    result.seconds = time.monotonic() - start
    sampling = False
    sampler.join(2)
    return result


def report(r: Result, base: Result | None) -> str:
    fails = ", ".join(f"{k}: {v}" for k, v in sorted(r.failures.items())) or "none"
    lines = [
        f"concurrency {r.concurrency}: {r.seconds:.1f} s",
        f"  answered {r.answered}  shed with retry-after {r.shed}  "
        f"shed without retry-after {r.shed_without_retry_after}  other failures: {fails}",
        f"  latency of answered requests: p50 {r.pct(0.5) * 1000:.0f} ms  "
        f"p90 {r.pct(0.9) * 1000:.0f} ms  p99 {r.pct(0.99) * 1000:.0f} ms  "
        f"max {max(r.latencies, default=float('nan')) * 1000:.0f} ms",
        f"  throughput {r.throughput:.2f} answered/s",
    ]
    if base is not None and base.throughput:
        lines[-1] += f"  ({r.throughput / base.throughput:.2f}x the {base.concurrency}-client run)"
    if r.rss_mb:
        lines.append(f"  server RSS: start {r.rss_mb[0]:.0f} MiB  peak {max(r.rss_mb):.0f} MiB  "
                     f"end {r.rss_mb[-1]:.0f} MiB")
    return "\n".join(lines)


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"load_test: refusing to load a non-loopback address ({host})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "onepass.cli", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", *extra]
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("server did not become ready in 300 s")


def server_summary(url: str) -> str:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""
    keep = ("onepass_requests_shed_total", "onepass_prefix_cache_hits_total",
            "onepass_prefix_cache_partial_hits_total", "onepass_prefix_cache_misses_total",
            "onepass_prefix_cache_evictions_total", "onepass_prefix_cache_resident_tokens",
            "onepass_queue_wait_seconds_sum", "onepass_queue_wait_seconds_count",
            "onepass_compute_seconds_sum", "onepass_compute_seconds_count")
    out = [ln for ln in text.splitlines() if ln.startswith(keep)]
    return "server metrics:\n  " + "\n  ".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (loopback only); default: start one")
    p.add_argument("--pid", type=int, help="pid of the server given by --url, for its RSS")
    p.add_argument("--concurrency", default="1,8,32",
                   help="comma-separated client counts, run one after another (default 1,8,32)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds per concurrency level (default 60)")
    p.add_argument("--max-requests", type=int, default=20000,
                   help="at most this many requests per level (default 20000)")
    p.add_argument("--states", type=int, default=24,
                   help="distinct states in the request pool (default 24)")
    p.add_argument("--state-size", choices=sorted(STATE_LINES), default="mixed",
                   help="short (~100-token states), long (~512) or mixed (default)")
    p.add_argument("--warmup", type=int, default=5, help="requests sent before measuring")
    p.add_argument("--server-args", default="",
                   help="extra `onepass serve` flags when the script starts the server")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not levels or min(levels) < 1 or max(levels) > 256:
        raise SystemExit("--concurrency: 1 to 256 clients")
    if not 0 < args.duration <= 600:
        raise SystemExit("--duration: 1 to 600 seconds")

    proc = None
    pid = args.pid
    if args.url:
        check_loopback(args.url)
        url = args.url.rstrip("/")
    else:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"onepass-load-{os.getpid()}.log"
        proc, url = start_server(args.server_args.split(), log_path)
        pid = proc.pid
        print(f"started onepass serve (pid {pid}) at {url}; log {log_path}")
    endpoint = url + "/v1/systemone"
    states = make_states(args.states, args.state_size)
    failed = False
    try:
        if args.warmup:
            asyncio.run(run_level(endpoint, 1, 120, args.warmup, states, None))
        results: list[Result] = []
        for level in levels:
            r = asyncio.run(run_level(endpoint, level, args.duration, args.max_requests,
                                      states, pid))
            print(report(r, results[0] if results else None), flush=True)
            results.append(r)
            bad_5xx = sum(v for k, v in r.failures.items() if k.startswith("5"))
            if bad_5xx or r.failures or r.shed_without_retry_after:
                failed = True
        print(server_summary(url))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("RESULT:", "FAIL" if failed else "OK (no 5xx; every response answered or shed "
          "with retry-after)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
