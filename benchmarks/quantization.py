"""Quantization on the embedded model: size on disk, resident memory, latency and agreement
with the float model for none / fp8 / fp4. Prints one table from one run.

Each scheme is written by `onepass quantize` into a temporary directory, then measured in a
fresh process (so resident memory is its own): resident set size after load, bytes of
resident weights, per-request latency over the 100 probe requests (all cache misses), and the
answers, compared with the float model's (argmax agreement, mean total-variation distance).

    .venv/bin/python benchmarks/quantization.py [--threads 1] [--limit 100] [--plot latency.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "data"


def measure(model: str | None, threads: int, limit: int) -> dict:
    """Run in a fresh process: load ``model``, answer the probe requests."""
    import gc

    import torch

    from onepass.datasets import probe_requests
    from onepass.engine import DecisionEngine
    from onepass.server.runtime import resident_bytes

    torch.set_num_threads(threads)
    requests = probe_requests(SHARED, HERE / "data" / "handwritten.jsonl")[:limit]
    start = time.perf_counter()
    engine = DecisionEngine.from_pretrained(model)
    load = time.perf_counter() - start
    gc.collect()
    rss = resident_bytes()
    answers, seconds = [], []
    for request in requests:
        start = time.perf_counter()
        answers.append(engine.answer(request))
        seconds.append(time.perf_counter() - start)
    return {"load_seconds": load, "rss": rss, "weight_bytes": engine.backend.weight_bytes,
            "seconds": seconds, "answers": answers}


def in_fresh_process(model: str | None, threads: int, limit: int) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import quantization as q; "
            f"print(json.dumps(q.measure({model!r}, {threads}, {limit})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--plot", help="write a latency chart (PNG) here")
    args = parser.parse_args()

    from onepass.commands.quantize import quantize
    from onepass.evaluate import compare_answers
    from onepass.models import resolve

    float_dir = resolve().path
    base = in_fresh_process(None, args.threads, args.limit)
    base["disk"] = (float_dir / "model.safetensors").stat().st_size
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in ("none", "fp8", "fp4"):
            out = Path(tmp) / scheme
            start = time.perf_counter()
            quantize(None, None, scheme, out)
            print(f"quantized {scheme} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            rows[scheme] = in_fresh_process(str(out), args.threads, args.limit)
            rows[scheme]["disk"] = (out / "model.safetensors").stat().st_size

    print(f"\n{args.limit} probe requests, {args.threads} thread(s); ratios are to float32")
    print(f"{'scheme':8} {'disk MiB':>9} {'ratio':>6} {'weights MiB':>12} {'ratio':>6} "
          f"{'RSS MiB':>8} {'ratio':>6} {'median ms':>10} {'ratio':>6} {'agree':>6} {'mean TV':>8}")
    median = {name: statistics.median(r["seconds"]) for name, r in [("float32", base),
                                                                    *rows.items()]}
    for name, r in [("float32", base), *rows.items()]:
        cmp = compare_answers(base["answers"], r["answers"])
        print(f"{name:8} {r['disk'] / 2**20:9.1f} {r['disk'] / base['disk']:6.2f} "
              f"{r['weight_bytes'] / 2**20:12.1f} {r['weight_bytes'] / base['weight_bytes']:6.2f} "
              f"{r['rss'] / 2**20:8.1f} {r['rss'] / base['rss']:6.2f} "
              f"{median[name] * 1e3:10.0f} {median[name] / median['float32']:6.2f} "
              f"{cmp['agreement']:6.2f} {cmp['mean_tv']:8.3f}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = ["float32", *rows]
        data = [[s * 1e3 for s in (base if n == "float32" else rows[n])["seconds"]]
                for n in names]
        ax.boxplot(data, tick_labels=names)
        ax.set_ylabel("ms per request (cache miss)")
        ax.set_title("onepass: latency by weight format")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
