"""Quantization on the embedded model: size on disk, resident memory, latency and agreement
with the float32 model for float32 / bfloat16 / the float32 checkpoint with ``--compute int8``
(SmoothQuant at load) / int8 / fp8 / fp4 (each quantized scheme with
its working weights: ``int8`` = decoded once for PyTorch's int8 kernel, ``stored`` = decoded on
every forward, ``auto`` = decoded once into the model's float dtype). fp4 rows are plain
round-to-nearest (``--calibration-dataset none``) unless the row says ``gptq`` (calibrated on
the shipped datasets' train splits) or ``+fp8`` (GPTQ with the 16 layers of largest output
error kept at fp8, ``--keep-fp8 auto``). Prints one table from one run.

Each scheme is written by `onepass quantize` with its default embedding / head table (int8
for fp8/fp4 unless the row says ``e-bf16``, bfloat16 for int8) into
a temporary directory, then measured in a fresh process (so resident memory is its own):
resident set size after load, bytes of resident weights, per-request latency over the probe
requests (all cache misses), and the answers, compared with the float32 model's (argmax
agreement, mean total-variation distance).

    .venv/bin/python benchmarks/quantization.py [--threads 1] [--limit 100] [--model NAME]
        [--rows "int8,fp8 int8"]
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


def measure(model: str | None, threads: int, limit: int, dtype: str = "auto",
            compute: str | None = None) -> dict:
    """Run in a fresh process: load ``model`` (``dtype``, ``compute`` working weights),
    answer the probe requests."""
    import gc

    import torch

    from onepass.backends.torch import TorchBackend
    from onepass.datasets import probe_requests
    from onepass.engine import DecisionEngine
    from onepass.models import resolve
    from onepass.server.runtime import resident_bytes

    torch.set_num_threads(threads)
    requests = probe_requests(SHARED, HERE / "data" / "handwritten.jsonl")[:limit]
    start = time.perf_counter()
    resolved = resolve(model)
    engine = DecisionEngine(TorchBackend.load(resolved.path, name=resolved.name, device="cpu",
                                              dtype=dtype, compute=compute))
    load = time.perf_counter() - start
    gc.collect()
    rss = resident_bytes()
    answers, seconds = [], []
    for request in requests:
        start = time.perf_counter()
        answers.append(engine.answer(request))
        seconds.append(time.perf_counter() - start)
    return {"load_seconds": load, "rss": rss, "weight_bytes": engine.backend.weight_bytes,
            "seconds": seconds, "answers": answers, "compute": engine.backend.compute}


def in_fresh_process(model: str | None, threads: int, limit: int, dtype: str = "auto",
                     compute: str | None = None) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import quantization as q; "
            f"print(json.dumps(q.measure({model!r}, {threads}, {limit}, {dtype!r}, "
            f"{compute!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--plot", help="write a latency chart (PNG) here")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--rows", default=None,
                        help="comma-separated row names to run (default: every row; float32 "
                        "and bfloat16 always run: the ratios need them)")
    args = parser.parse_args()
    wanted = None if args.rows is None else {r.strip() for r in args.rows.split(",")}

    from onepass.commands.quantize import quantize
    from onepass.evaluate import compare_answers
    from onepass.models import resolve

    float_dir = resolve(args.model).path
    disk = sum(f.stat().st_size for f in float_dir.glob("*.safetensors"))
    rows: dict[str, dict] = {}
    for name, dtype, compute in (("float32", "float32", "auto"), ("bfloat16", "bfloat16", "auto"),
                                 ("f32→int8", "float32", "int8")):  # --compute int8 at load
        if name == "f32→int8" and wanted is not None and name not in wanted:
            continue
        rows[name] = in_fresh_process(args.model, args.threads, args.limit, dtype, compute)
        rows[name]["disk"] = disk // 2 if name == "bfloat16" else disk  # bf16: half the bytes
    with tempfile.TemporaryDirectory() as tmp:
        # (row, scheme, embedding codec, compute at load, fp4 calibration)
        for name, scheme, embedding, compute, calibration in (
                ("int8", "int8", "bfloat16", "int8", None),
                ("int8 auto", "int8", "bfloat16", "auto", None),  # int8 weights, float compute
                ("fp8 int8", "fp8", "int8", "int8", None),
                ("fp8 stored", "fp8", "int8", "stored", None),
                ("fp8 e-bf16", "fp8", "bfloat16", "stored", None),
                ("fp4 int8", "fp4", "int8", "int8", "none"),
                ("fp4 stored", "fp4", "int8", "stored", "none"),
                ("fp4 e-bf16", "fp4", "bfloat16", "stored", "none"),
                ("fp4 gptq", "fp4", "int8", "stored", "gptq"),
                ("fp4 +fp8", "fp4", "int8", "stored", "keep")):
            if wanted is not None and name not in wanted:
                continue
            out = Path(tmp) / f"{scheme}-{embedding}-{calibration}"
            if not out.exists():
                start = time.perf_counter()
                quantize(args.model, None, scheme, out, embedding=embedding,
                         calibration_dataset="none" if calibration == "none" else None,
                         keep_fp8="auto" if calibration == "keep" else None)
                print(f"quantized {scheme} (embedding {embedding}, calibration {calibration}) "
                      f"in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            rows[name] = in_fresh_process(str(out), args.threads, args.limit, "auto", compute)
            rows[name]["disk"] = (out / "model.safetensors").stat().st_size
            print(f"measured {name}", file=sys.stderr)

    base = rows["float32"]
    print(f"\n{args.limit} probe requests, {args.threads} thread(s); ratios are to float32; "
          "bfloat16 disk = half of float32's (not written)")
    print(f"{'row':11} {'compute':9} {'disk MiB':>9} {'ratio':>6} {'weights MiB':>12} {'ratio':>6} "
          f"{'RSS MiB':>8} {'ratio':>6} {'median ms':>10} {'ratio':>6} {'vs bf16':>7} "
          f"{'agree':>6} {'mean TV':>8}")
    median = {name: statistics.median(r["seconds"]) for name, r in rows.items()}
    for name, r in rows.items():
        cmp = compare_answers(base["answers"], r["answers"])
        print(f"{name:11} {r['compute']:9} {r['disk'] / 2**20:9.1f} "
              f"{r['disk'] / base['disk']:6.2f} "
              f"{r['weight_bytes'] / 2**20:12.1f} {r['weight_bytes'] / base['weight_bytes']:6.2f} "
              f"{r['rss'] / 2**20:8.1f} {r['rss'] / base['rss']:6.2f} "
              f"{median[name] * 1e3:10.0f} {median[name] / median['float32']:6.2f} "
              f"{median[name] / median['bfloat16']:7.2f} "
              f"{cmp['agreement']:6.2f} {cmp['mean_tv']:8.3f}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4))
        names = list(rows)
        data = [[s * 1e3 for s in rows[n]["seconds"]] for n in names]
        ax.boxplot(data, tick_labels=names)
        ax.tick_params(axis="x", labelrotation=40)
        ax.set_ylabel("ms per request (cache miss)")
        ax.set_title("onepass: latency by weight format")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
