"""Sequential vs batch schema decisions: 16 independent boolean fields over a ~1,000-token
context on the embedded model (the TypeAR comparison: batch 5.8x faster on a GPU server).

Two starting points per mode, each repeated and the median kept:

* **cold** — the prefix cache holds only the pinned system text: the context is prefilled
  inside the timed call (the TypeAR setting);
* **context cached** — the document prefix is prefilled before the timed call, isolating the
  per-decision cost (sequential: 16 forwards of ~40-token tails; batch: one packed forward).

It also prints, per field, the prompt tokens taken from the prefix cache: in sequential mode
field k+1 reuses all of field k's prompt. Prints numbers, asserts nothing about time.

    .venv/bin/python benchmarks/schema_modes.py [--repeats 3] [--threads N] [--tokens 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "examples" / "schema_flags.json"
BASE = ROOT / "examples" / "schema_context.txt"

FILLER = [
    "Line {n}: Taxi from the client site to the office, {a}.{b} GBP, corporate card, receipt "
    "attached.",
    "Line {n}: Team lunch with the regional sales staff, {a}.{b} GBP, paid personally; itemised "
    "receipt attached.",
    "Line {n}: Train ticket London to Manchester (return), {a}.{b} GBP, booked through the travel "
    "portal.",
    "Line {n}: Hotel night at the Premier Inn, {a}.{b} GBP including breakfast, corporate card.",
    "Note {n}: the approver asked for the project code to be added to every line before "
    "payment; Dana confirmed the code is SALES-EMEA-{a}.",
]


def build_context(engine, target_tokens: int) -> str:
    """The example report, padded with plausible lines up to about ``target_tokens``."""
    text = BASE.read_text().strip()
    n = 4
    while len(engine.backend.encode(text)) < target_tokens:
        line = FILLER[n % len(FILLER)].format(n=n, a=10 + (n * 7) % 90, b=(n * 13) % 100)
        text += "\n" + line
        n += 1
    return text


def timed(engine, context, schema, mode, prefill_context: bool):
    from onepass import prompt as P

    engine.backend.cache.clear()  # pinned system text stays
    if prefill_context:
        ids = engine.backend.encode(
            P.render_prefix(engine.format, context, engine.context, engine.specials)
        )
        engine.backend.prefill(ids[:-2])  # leave the boundary tokens: they may merge
    start = time.perf_counter()
    decision = engine.decide_schema(context, schema, mode=mode)
    return time.perf_counter() - start, decision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1000, help="context size (tokens)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()

    import torch

    from onepass import DecisionEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = DecisionEngine.from_pretrained(args.model)
    schema = json.loads(SCHEMA.read_text())
    context = build_context(engine, args.tokens)
    context_tokens = len(engine.backend.encode(context))
    fields = len(schema["properties"])
    print(f"model={engine.served_name} device={engine.backend.device} "
          f"threads={torch.get_num_threads()} fields={fields} context_tokens={context_tokens} "
          f"repeats={args.repeats}")

    timed(engine, context, schema, "batch", False)  # warm-up (allocator, kernels)
    results: dict[str, dict] = {}
    for start in ("cold", "context cached"):
        for mode in ("sequential", "batch"):
            runs = [timed(engine, context, schema, mode, start != "cold")
                    for _ in range(args.repeats)]
            seconds = statistics.median(t for t, _ in runs)
            decision = runs[-1][1]
            results[f"{start}/{mode}"] = {
                "seconds": seconds,
                "per_decision": seconds / fields,
                "reused": [f.cached_tokens for f in decision.fields.values()],
                "prompt": [f.prompt_tokens for f in decision.fields.values()],
                "usage": decision.usage,
                "value": decision.value,
            }

    print()
    print("| start | mode | end-to-end | per decision | relative |")
    print("|---|---|---|---|---|")
    for start in ("cold", "context cached"):
        seq = results[f"{start}/sequential"]["seconds"]
        for mode in ("sequential", "batch"):
            r = results[f"{start}/{mode}"]
            print(f"| {start} | {mode} | {r['seconds']:.3f} s | {r['per_decision']:.4f} s | "
                  f"{seq / r['seconds']:.2f}x |")
    print()
    for key, r in results.items():
        print(f"{key}: reused tokens per field {r['reused']}")
        print(f"{key}: prompt tokens per field {r['prompt']}")
        print(f"{key}: usage {r['usage']}")
    seq = results["cold/sequential"]
    hits = all(seq["reused"][k + 1] == seq["prompt"][k] for k in range(fields - 1))
    print(f"sequential: field k+1 reused all of field k's prompt: {hits}")
    same = sum(results["cold/sequential"]["value"][k] == results["cold/batch"]["value"][k]
               for k in schema["properties"])
    print(f"fields where sequential and batch agree: {same}/{fields} "
          "(different conditionals: agreement is not required)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
