"""Median latency of a 16-question request on a ~512-token state, miss and hit, per backend.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/backends.py [--model ALIAS] [--reps 5]
        [--backends torch,llamacpp,llama-cpp-python] [--strategies]

``--strategies`` also times the llamacpp suffix strategies (one batch of sequences copied from
the prefix vs decode-and-truncate per suffix). Printed ratios from one run; never asserted.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backends", default="torch,llamacpp,llama-cpp-python")
    ap.add_argument("--strategies", action="store_true")
    args = ap.parse_args()
    from onepass.engine import DecisionEngine

    rows = []
    for name in args.backends.split(","):
        if name in ("torch", "llamacpp"):
            engine = DecisionEngine.from_pretrained(args.model, backend=name)
            rows.append((name, *timed(engine, args.reps)))
            if name == "llamacpp" and args.strategies:
                engine.backend.strategy = "truncate"
                rows.append(("llamacpp (truncate)", *timed(engine, args.reps)))
        elif name == "llama-cpp-python":
            from server_process import free_port
            from test_backend_remote_live import llama_cpp_server

            from onepass.backends.remote import RemoteBackend
            from onepass.models import resolve

            port = free_port()
            with llama_cpp_server(port, Path("/tmp/bench_llama.log")):
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(resolve(args.model).path)
                remote = RemoteBackend("llama-cpp-python", f"http://127.0.0.1:{port}", tok,
                                       name="remote")
                rows.append(("remote (llama-cpp-python server)",
                             *timed(DecisionEngine(remote), args.reps)))
    print("| backend | miss (s) | hit (s) |\n|---|---|---|")
    for name, miss, hit in rows:
        print(f"| {name} | {miss:.3f} | {hit:.3f} |")


if __name__ == "__main__":
    main()
