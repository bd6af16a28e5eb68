"""Scale-out through a real cache-aware router, on CPU: two `onepass serve` workers on the
embedded model, the real `sglang-router` binary (PyPI ``sglang-router==0.3.2``, a Rust router)
in ``cache_aware`` policy over them, and a onepass front-end with ``--backend remote --engine
onepass --engine-url <router>`` in front — the deploy/ topology with onepass workers standing in
for SGLang GPU workers.

It proves what the deployment relies on: requests about the same state land on the same worker
every time (that worker's prefix-cache hits rise with each repeat) while distinct states spread
over both workers, and a worker that dies is routed around once the router's health check
notices, with the same answers from the survivor.

The router is an optional binary: missing, these tests skip; under ``CI=true`` they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import running_in_ci
from server_process import free_port, running, serve, serve_process

SENTENCE = ("The customer says the parcel came {n} days late, the box was crushed, the receipt "
            "shows shipping charged twice and nobody answered the phone on day {n}. ")
QUESTIONS = {
    "angry": {"type": "noul", "instructions": "The customer is upset."},
    "topic": {"type": "choice", "instructions": "What is the ticket about?",
              "criteria": {"delivery": None, "billing": None, "login": None}},
}


def state_request(n: int, sentences: int = 12) -> dict:
    """A decision request about state ``n``: a few hundred tokens, so the state dominates the
    routed text (the shared system prompt alone stays under the cache threshold)."""
    return {"state": f"Ticket {n}. " + "".join(SENTENCE.format(n=n + k)
                                               for k in range(sentences)),
            "questions": QUESTIONS}


def router_available() -> bool:
    return (importlib.util.find_spec("sglang_router") is not None
            and importlib.util.find_spec("sglang_router.sglang_router_rs") is not None)


@contextlib.contextmanager
def router(workers: Sequence[str], log_path: Path, *, policy: str = "cache_aware",
           health_interval: int = 1) -> Iterator[str]:
    """The real sglang-router over ``workers``; yields its URL once every worker is registered
    healthy, and stops it afterwards."""
    port = free_port()
    args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--prometheus-port", str(free_port()),
            "--policy", policy, "--worker-urls", *workers,
            "--health-check-interval-secs", str(health_interval),
            "--health-failure-threshold", "2", "--health-check-timeout-secs", "2",
            "--cb-failure-threshold", "3",  # under the 5 retries: a dead worker's request
            # opens its circuit and is retried on another worker instead of failing
            "--worker-startup-check-interval", "1", "--log-level", "warn"]
    with open(log_path, "a") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def registered() -> bool:
        listed = httpx.get(url + "/workers", timeout=2).json()["workers"]
        return len(listed) == len(workers) and all(w["is_healthy"] for w in listed)

    with running(proc, log_path, registered, seconds=60, what="router", grace=15):
        yield url


def worker_counts(url: str) -> dict[str, float]:
    """``/generate`` calls answered and exact prefix-cache hits (the whole shared prefix of a
    request was cached: a repeated state) of one worker, from its ``/metrics``."""
    generate = hits = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        name, _, value = line.rpartition(" ")
        if (name.startswith("onepass_http_requests_total{") and 'route="/generate"' in name
                and 'status="200"' in name):
            generate += float(value)
        elif name == "onepass_prefix_cache_hits_total":
            hits += float(value)
    return {"generate": generate, "hits": hits}


@pytest.fixture(scope="module")
def topology(tmp_path_factory) -> Iterator[dict]:
    """Two workers, the router over them (cache_aware), a front-end over the router."""
    if not router_available():
        message = "sglang-router is not installed (pip install sglang-router==0.3.2)"
        if running_in_ci():
            pytest.fail(message + "; CI must run every test", pytrace=False)
        pytest.skip(message)
    logs = tmp_path_factory.mktemp("router")
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(serve_process([], logs / f"worker{i}.log"))
                   for i in range(2)]
        urls = [url for url, _ in workers]
        router_url = stack.enter_context(router(urls, logs / "router.log"))
        front = stack.enter_context(serve(
            ["--backend", "remote", "--engine", "onepass", "--engine-url", router_url],
            logs / "front.log"))
        yield {"workers": workers, "router": router_url, "front": front, "logs": logs}


def _ask(front: str, n: int) -> dict:
    r = httpx.post(front + "/v1/systemone", json=state_request(n), timeout=180)
    assert r.status_code == 200, r.text
    return r.json()


def _probs(answers: dict) -> list[float]:
    """Every answer's distribution, flattened in a fixed order."""
    out: list[float] = []
    for name in sorted(answers):
        a = answers[name]
        out += [a["noul"]] if a["type"] == "noul" else list(a["probabilities"].values())
    return out


def test_same_state_same_worker_and_cache_hits_rise(topology):
    """Round 1 asks about every state at once: each is a cache miss, which sglang-router 0.3.2
    sends to the least-loaded worker, so concurrent misses spread over both. Every later
    request is one at a time: it must land on one worker, the same one for every repeat of a
    state, and be an exact prefix-cache hit there (so it went where round 1 computed it)."""
    urls = [url for url, _ in topology["workers"]]
    states = range(6)
    before = [worker_counts(u) for u in urls]
    with ThreadPoolExecutor(len(states)) as pool:
        first = dict(zip(states, pool.map(lambda n: _ask(topology["front"], n), states)))
    spread = [worker_counts(u)["generate"] - b["generate"] for u, b in zip(urls, before)]
    print("round 1 (concurrent misses) per worker:", spread)
    assert sum(spread) == len(states) and min(spread) >= 1, spread
    placement: dict[int, list[int]] = {}
    for _ in range(2):
        for n in states:
            counts = [worker_counts(u) for u in urls]
            got = _ask(topology["front"], n)
            after = [worker_counts(u) for u in urls]
            moved = [i for i in (0, 1) if after[i]["generate"] > counts[i]["generate"]]
            assert len(moved) == 1, (counts, after)  # one decision request, one /generate
            worker = moved[0]
            assert after[worker]["hits"] == counts[worker]["hits"] + 1, (n, counts, after)
            assert got["usage"]["cached_tokens"] > 0  # the front-end reports the engine's hit
            assert _probs(got["answers"]) == pytest.approx(_probs(first[n]["answers"]),
                                                           abs=1e-4)
            placement.setdefault(n, []).append(worker)
    print("placement of the repeats (state: workers):", placement)
    for n, where in placement.items():
        assert len(set(where)) == 1, f"state {n} moved between workers: {where}"
    assert {w[0] for w in placement.values()} == {0, 1}
    topology["placement"], topology["answers"] = placement, first


def test_a_dead_worker_is_routed_around(topology):
    placement = topology.get("placement")
    if placement is None:
        pytest.skip("needs the placement of the routing test")
    (_, victim), (survivor_url, _) = topology["workers"][0], topology["workers"][1]
    victim.kill()  # the worker dies: no drain, no goodbye
    victim.wait(10)
    killed = time.monotonic()
    # at once, before any health check: the router still sends its state there, the send
    # fails, the circuit opens within the retries and the retry goes to the survivor
    orphan = next(n for n, where in placement.items() if where[0] == 0)
    assert _probs(_ask(topology["front"], orphan)["answers"]) == pytest.approx(
        _probs(topology["answers"][orphan]["answers"]), abs=1e-4)
    while True:  # the router's health check (1 s interval, 2 failures) marks it unhealthy
        listed = httpx.get(topology["router"] + "/workers", timeout=5).json()["workers"]
        if len(listed) < 2 or not all(w["is_healthy"] for w in listed):
            break
        assert time.monotonic() < killed + 30, listed
        time.sleep(0.25)
    print(f"the router marked the dead worker unhealthy after {time.monotonic() - killed:.1f} s")
    before = worker_counts(survivor_url)["generate"]
    for n in placement:  # the dead worker's states too, with the same answers
        got = _ask(topology["front"], n)
        assert _probs(got["answers"]) == pytest.approx(
            _probs(topology["answers"][n]["answers"]), abs=1e-4), n
    assert worker_counts(survivor_url)["generate"] - before == len(placement)
    assert httpx.get(topology["front"] + "/health", timeout=10).status_code == 200
    # the last worker dies too: the router's /health stays 200 (its liveness), its /readiness
    # turns 503, and so do the front-end's /health and its answers (retry-after), never a 500
    topology["workers"][1][1].kill()
    topology["workers"][1][1].wait(10)
    deadline = time.monotonic() + 30
    while httpx.get(topology["router"] + "/readiness", timeout=5).status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.25)
    assert httpx.get(topology["router"] + "/health", timeout=5).status_code == 200
    assert httpx.get(topology["front"] + "/health", timeout=10).status_code == 503
    down = httpx.post(topology["front"] + "/v1/systemone", json=state_request(0), timeout=60)
    assert down.status_code == 503, down.text
    assert down.json()["error"]["type"] == "engine_unavailable" and down.headers["retry-after"]


def test_deploy_files_speak_the_real_clis():
    """deploy/'s router and onepass commands parse with the real CLIs (the router's flags are
    the 0.3.2 binary's), and every router probe path is one the router answers."""
    import yaml

    from onepass.cli import build_parser

    if not router_available():
        if running_in_ci():
            pytest.fail("sglang-router is not installed; CI must run every test", pytrace=False)
        pytest.skip("sglang-router is not installed (pip install sglang-router==0.3.2)")
    from sglang_router.launch_router import parse_router_args

    deploy = Path(__file__).resolve().parent.parent / "deploy"
    commands: list[list[str]] = []
    for name in ("docker-compose.scaleout.yml", "docker-compose.scaleout-cpu.yml"):
        doc = yaml.safe_load((deploy / name).read_text().replace(
            "${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}", "Qwen/Qwen2.5-0.5B-Instruct"))
        for service in [doc["x-worker"], *doc["services"].values()]:
            if isinstance(service.get("command"), str):
                commands.append(service["command"].split())
    routers = 0
    for doc in yaml.safe_load_all((deploy / "k8s" / "scaleout.yaml").read_text()):
        if doc["kind"] in ("Deployment", "StatefulSet"):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            commands.append(container["args"])
            if "router" in container["image"]:
                assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
                assert container["livenessProbe"]["httpGet"]["path"] == "/liveness"
    parser = build_parser()
    for args in commands:
        if args[0] == "onepass":
            parsed = parser.parse_args(args[1:])
            assert parsed.port == 8080  # deploy/Dockerfile.cpu's HEALTHCHECK port
        elif args[0].startswith("--"):  # the router image's entrypoint is launch_router
            routers += 1
            parsed = parse_router_args(args)
            assert parsed.policy == "cache_aware" and len(parsed.worker_urls) == 2
            assert parsed.health_check_endpoint == "/health"
            assert parsed.cb_failure_threshold < parsed.retry_max_retries
    assert routers == 3
