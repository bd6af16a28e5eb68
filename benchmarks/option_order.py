"""Which zero-cost option order should a choice be read in? Declared order (``none``), name
order (``name-order``: the options sorted by name, one reading) and, for reference, every
rotation of the name order (``rotations``: K readings). Prints ratios from one run; never a
timed test.

Per setting, on one model: zero-shot accuracy on CLINC150 10-domain routing and the BANKING77
10-intent subset (test splits, the ``onepass bench`` records), the flip rate of the top answer
under a seeded shuffle and under reversal of the declared options (CLINC150 records), JevBench
mini (customer_support + ecommerce_returns, with its REP dimension: answers that must not move
when options are reordered) and the median latency of a request relative to ``none``.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/option_order.py [--model ALIAS] [--limit 100]
        [--flip-records 60] [--no-jevbench] [--settings none,name-order,rotations]

Rotations read K prompts per choice: on the embedded model on 2 cores the whole run takes
about 18 minutes per one-reading setting and several times that for ``rotations``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from onepass import DecisionEngine
from onepass import bench as B
from onepass import calibration as C
from onepass.datasets import strip_answers

SETTINGS = ("none", "name-order", "rotations")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def flips(engine: DecisionEngine, records: list, debias: str, reverse: bool, seed: int
          ) -> float:
    """Share of records whose top answer moves when the options are reversed (or shuffled)."""
    if not reverse:
        return B.flip_rate(engine, records, debias, seed)["flip_rate"]
    moved = 0
    for record in records:
        request, _ = strip_answers(record.raw)
        name, question = next(iter(request["questions"].items()))
        flipped = {**question, "criteria": dict(reversed(list(question["criteria"].items())))}
        a = engine.answer(request, debias=debias)["answers"][name]["choice"]
        b = engine.answer({**request, "questions": {name: flipped}},
                          debias=debias)["answers"][name]["choice"]
        moved += a != b
    return moved / max(1, len(records))


def milliseconds(engine: DecisionEngine, records: list, debias: str) -> float:
    times = []
    for record in records:
        request, _ = strip_answers(record.raw)
        start = time.perf_counter()
        engine.answer(request, debias=debias)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--flip-records", type=int, default=60)
    ap.add_argument("--no-jevbench", action="store_true")
    ap.add_argument("--data-dir", type=Path, default=SHARED)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    args = ap.parse_args()
    engine = DecisionEngine.from_pretrained(args.model)
    config = B.BenchConfig(data_dir=args.data_dir, limit=args.limit, fit_limit=1, teach=(),
                           datasets=("clinc150", "banking77"))
    data = B.datasets(config)
    clinc = data["clinc150"]["test"]
    rows = {}
    for debias in args.settings.split(","):
        row = {name: B.quality(C.collect(engine, parts["test"], debias=debias))["accuracy"]
               for name, parts in data.items()}
        row["shuffle"] = flips(engine, clinc[: args.flip_records], debias, False, 0)
        row["reverse"] = flips(engine, clinc[: args.flip_records], debias, True, 0)
        row["ms"] = milliseconds(engine, clinc[:20], debias)
        if not args.no_jevbench:
            jev = B.jevbench(engine, B.JEVBENCH_DOMAINS, debias)
            row["jevbench"] = jev["overall"]
            row["rep"] = jev["dimensions"].get("REP")
        rows[debias] = row
        print(f"{debias}: {row}", flush=True)
    print(f"\n{engine.served_name}, {args.limit} test records per dataset, "
          f"flips over {args.flip_records} CLINC150 records, one run")
    head = "| setting | CLINC150 10-domain | BANKING77 subset | flips (shuffle) | flips (reverse) |"
    head += "" if args.no_jevbench else " JevBench mini | REP |"
    print(head + " latency vs none |")
    print("|---" * (head.count("|")) + "|")
    for debias, row in rows.items():
        line = (f"| `{debias}` | {row['clinc150']:.2f} | {row['banking77']:.2f} | "
                f"{row['shuffle']:.2f} | {row['reverse']:.2f} |")
        if not args.no_jevbench:
            rep = row["rep"]
            # jevbench reports fractions; the README quotes percentages
            line += f" {100 * row['jevbench']:.1f} | {rep if rep is None else f'{100 * rep:.1f}'} |"
        base = rows.get("none", row)["ms"]
        print(line + f" {row['ms'] / base:.2f}x |")


if __name__ == "__main__":
    main()
