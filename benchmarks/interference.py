"""Inter-token latency of streams alone vs beside other model work on the same model.

    python benchmarks/interference.py [--streams 4] [--tokens 48] [--slowdowns 0,1.5]

Every piece of model work the server runs goes through the model's one step scheduler, so a
decision's open value (a greedy sequence), a decoder embedding and prompt scoring (readings)
share steps with the streams instead of holding the model between them. This measures what a
streaming client feels: the median and p90 gap between its tokens, with the streams alone and
then while a second thread keeps asking open-field schema decisions, embeddings and prompt
scores. (The backend's own greedy loop, which held the model lock for a whole open value and
stalled every stream meanwhile, is gone: the scheduler is the one decode loop.)

A benchmark prints ratios from one run; it asserts nothing (tests/test_one_executor.py does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from onepass.generate.pace import DEFAULT_STREAM_SLOWDOWN, StepPace  # noqa: E402

CONTEXT = "Taxi from the airport to the hotel, 42 EUR, paid personally; the receipt is missing."
SCHEMA = {"properties": {"note": {"type": "string", "x-open": True, "maxLength": 400,
                                  "description": "Describe the expense in two sentences"}}}


def gaps(engine, streams: int, tokens: int, busy: threading.Event | None = None) -> list[float]:
    """Seconds between consecutive tokens of ``streams`` greedy streams (all gaps pooled)."""
    from onepass.generate.sampling import SamplingParams

    scheduler = engine.generator.scheduler
    out: list[float] = []
    lock = threading.Lock()

    def read(i: int) -> None:
        prompt = engine.generator.chat_prompt(
            [{"role": "user", "content": f"Count from {i * 100} upwards, one number a line."}])
        stream = scheduler.submit(prompt, SamplingParams(temperature=0.0, ignore_eos=True),
                                  tokens)
        last = None
        for _ in stream:
            now = time.monotonic()
            if last is not None:
                with lock:
                    out.append(now - last)
            last = now

    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def other_work(engine, stop: threading.Event, counts: dict[str, int]) -> None:
    """Open-field decisions, a decoder embedding and prompt scoring, round and round."""
    backend = engine.backend
    scheduler = engine.generator.scheduler
    text = backend.encode("The receipt for the taxi is missing; the customer paid 42 EUR. " * 8)
    while not stop.is_set():
        engine.decide_schema(CONTEXT, SCHEMA, mode="sequential", max_open_tokens=32)
        counts["open values"] += 1
        scheduler.read(backend.embedding_reader([text]))
        counts["embeddings"] += 1
        scheduler.read(backend.scoring_reader(text, 0))
        counts["prompt scores"] += 1


def measure(engine, args, label: str) -> dict[str, float]:
    stop = threading.Event()
    counts = {"open values": 0, "embeddings": 0, "prompt scores": 0}
    worker = threading.Thread(target=other_work, args=(engine, stop, counts))
    worker.start()
    time.sleep(0.5)  # the other work is under way
    try:
        pooled = gaps(engine, args.streams, args.tokens)
    finally:
        stop.set()
        worker.join()
    return summary(label, pooled, counts)


def summary(label: str, pooled: list[float], counts: dict[str, int] | None = None
            ) -> dict[str, float]:
    pooled = sorted(pooled)
    row = {"median": statistics.median(pooled), "p90": pooled[int(0.9 * (len(pooled) - 1))],
           "max": pooled[-1]}
    extra = f" ({', '.join(f'{v} {k}' for k, v in counts.items())} meanwhile)" if counts else ""
    print(f"{label:<34} median {row['median'] * 1000:7.1f} ms  p90 {row['p90'] * 1000:7.1f} ms"
          f"  max {row['max'] * 1000:7.1f} ms{extra}")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48, help="tokens per stream")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--step-tokens", type=int, default=0,
                   help="the scheduler's tokens per step (0: its default)")
    p.add_argument("--slowdowns", default=f"0,{DEFAULT_STREAM_SLOWDOWN}",
                   help="the scheduler's stream slowdowns to compare (0: no pace, every step "
                   "carries other work up to the step budget)")
    args = p.parse_args(argv)

    import torch

    from onepass.engine import DecisionEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = DecisionEngine.from_pretrained()
    if args.step_tokens:
        engine.generation_options["step_tokens"] = args.step_tokens
    engine.share_steps()
    gaps(engine, args.streams, 8)  # warm-up: first forwards, arena allocation
    scheduler = engine.generator.scheduler
    alone = summary(f"{args.streams} streams alone", gaps(engine, args.streams, args.tokens))
    for slowdown in (float(x) for x in args.slowdowns.split(",")):
        scheduler.pace = StepPace(slowdown) if slowdown else None
        label = f"+ other work, slowdown {slowdown:g}" if slowdown else "+ other work, no pace"
        shared = measure(engine, args, label)
        print(f"{'':<34} / alone: median {shared['median'] / alone['median']:.2f}x, "
              f"p90 {shared['p90'] / alone['p90']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
