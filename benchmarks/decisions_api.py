"""The OpenAI Decisions API next to System One: the same questions, the same answers, and what
the route costs.

    python benchmarks/decisions_api.py [--rounds 5] [--url http://127.0.0.1:8000]

Starts one `onepass serve` (the embedded model; or use ``--url``), turns each of the 35
hand-written mixed noul/choice/score probes that have a twin into both bodies (a noul is a
predicate, a choice's criteria are its choices, a score's criteria its levels; a predicate has
no yes/no criteria, so the one noul that describes its answers is left out), and asks each on
both routes: once to warm the prefix cache, then ``--rounds`` times alternating which route
goes first. It prints the largest difference between the two routes' probabilities (they
render one prompt, so it must be 0 up to float formatting) and the latency ratio Decisions /
System One (median over requests of the per-request medians), for a user's raw HTTP and for
the official `openai` SDK's ``client.decisions.create``. A benchmark prints ratios from one
run; it asserts nothing (tests/test_decisions_openai_e2e.py does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from load_test import start_server  # noqa: E402  (benchmarks/ is not a package)

PROBES = ROOT / "data" / "handwritten.jsonl"


def both_bodies(probe: dict, model: str) -> tuple[dict, dict, list[tuple[str, list]]]:
    """A probe as a System One body, as a Decisions body, and how to read each answer back
    (per question: its name and option names in declared order)."""
    system_one = {"state": probe["state"], "questions": {}}
    questions, options = [], []
    for name, q in probe["questions"].items():
        q = {k: v for k, v in q.items() if k != "answer"}
        system_one["questions"][name] = q
        if q["type"] == "noul":
            questions.append({"type": "predicate", "name": name, "instructions": q["instructions"]})
            options.append((name, []))
            continue
        criteria = q["criteria"]
        pairs = list(criteria.items()) if isinstance(criteria, dict) else \
            [(c, None) for c in criteria]
        if q["type"] == "choice":
            questions.append({"type": "choice", "name": name, "instructions": q["instructions"],
                              "choices": [{"value": v, **({"description": d} if d else {})}
                                          for v, d in pairs]})
        else:
            questions.append({"type": "score", "name": name, "instructions": q["instructions"],
                              "levels": [{"label": v, **({"description": d} if d else {})}
                                         for v, d in pairs]})
        options.append((name, [v for v, _ in pairs]))
    decisions = {"model": model, "input": probe["state"], "questions": questions}
    return system_one, decisions, options


def distributions(system_one: dict, decisions: dict, options: list) -> tuple[list, list]:
    a, b = [], []
    for (name, names), answer in zip(options, decisions["answers"]):
        ref = system_one["answers"][name]
        if not names:
            a.append([ref["noul"]])
            b.append([answer["probability"]])
        else:  # a score's System One probabilities are keyed by level index
            keys = names if ref["type"] == "choice" else [str(i) for i in range(len(names))]
            a.append([ref["probabilities"][k] for k in keys])
            b.append([p["probability"] for p in answer["probabilities"]])
    return a, b


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running onepass server (default: start one)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    import openai

    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(["--threads", "2"], Path("/tmp/decisions_api_bench.log"))
    try:
        http = httpx.Client(base_url=url, timeout=300)
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0, timeout=300)
        model = http.get("/v1/models").json()["data"][0]["id"]
        probes = [json.loads(line) for line in PROBES.read_text().splitlines() if line.strip()]
        # a predicate has no yes/no criteria: a noul that describes its answers has no twin
        probes = [pr for pr in probes if not any(q["type"] == "noul" and q.get("criteria")
                                                 for q in pr["questions"].values())]
        bodies = [both_bodies(pr, model) for pr in probes]

        def system_one(body: dict) -> dict:
            r = http.post("/v1/systemone", json=body)
            r.raise_for_status()
            return r.json()

        def decisions(body: dict) -> dict:
            r = http.post("/v1/decisions", json=body)
            r.raise_for_status()
            return r.json()

        def decisions_sdk(body: dict) -> object:
            return sdk.decisions.create(**body)

        worst = 0.0
        for s1, dec, options in bodies:  # warm the prefix cache; compare the answers
            a, b = distributions(system_one(s1), decisions(dec), options)
            worst = max([worst, *(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))])
        times: dict[str, list[list[float]]] = {k: [[] for _ in bodies]
                                               for k in ("system_one", "decisions", "sdk")}
        for r in range(args.rounds):
            for i, (s1, dec, _) in enumerate(bodies):
                calls = [("system_one", system_one, s1), ("decisions", decisions, dec),
                         ("sdk", decisions_sdk, dec)]
                for name, call, body in calls[r % 3:] + calls[: r % 3]:
                    times[name][i].append(timed(lambda c=call, b=body: c(b))[0])
        median = {k: statistics.median(statistics.median(t) for t in v) for k, v in times.items()}
        print(f"{len(bodies)} hand-written probes ({sum(len(o) for *_, o in bodies)} questions), "
              f"{args.rounds} rounds on a warm cache")
        print(f"largest |probability difference| System One vs Decisions: {worst:.2e}")
        print(f"Decisions / System One latency (raw HTTP):   "
              f"{median['decisions'] / median['system_one']:.2f}x")
        print(f"Decisions (openai SDK) / System One latency: "
              f"{median['sdk'] / median['system_one']:.2f}x")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
