"""What the remembered row probe (``backends.rows.make_rows_invariant(memo=...)``) saves a load
of the embedded model, in one run: ``DecisionEngine.from_pretrained`` timed in fresh processes
(as ``onepass serve`` and every test server start pay it), with the probe run (an empty memo
folder) against the probe's finding recalled (the folder the first load wrote), at each thread
count asked for. Imports are outside the timed span; the median of ``--repeats`` loads each.

    .venv/bin/python benchmarks/load_time.py [--threads 1,2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
from onepass.engine import DecisionEngine
start = time.perf_counter()
engine = DecisionEngine.from_pretrained(device="cpu", dtype="float32")
print(json.dumps({"seconds": time.perf_counter() - start,
                  "scheme": engine.backend.row_scheme}))
"""


def load_seconds(threads: int, memo: Path) -> tuple[float, str]:
    """One load in a fresh process whose cache folder is ``memo``'s parent."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ONEPASS_CACHE_DIR": str(memo)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads)], env=env, check=True,
                         capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return row["seconds"], row["scheme"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from onepass.models import resolve

    checkpoint = resolve(None).path  # converted once into the user cache, before timing
    print(f"embedded checkpoint: {checkpoint}")
    print("| threads | scheme | probed (s) | recalled (s) | recalled / probed |")
    print("|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        probed, recalled = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as folder:
                cache = Path(folder)
                # the checkpoint where resolve() looks for it: link the converted one
                (cache / "checkpoints").mkdir()
                (cache / "checkpoints" / checkpoint.name).symlink_to(checkpoint)
                seconds, scheme = load_seconds(threads, cache)
                probed.append(seconds)
                assert any((cache / "row-schemes").glob("*.json")), "the probe was not kept"
                seconds, again = load_seconds(threads, cache)
                assert again == scheme
                recalled.append(seconds)
        a, b = statistics.median(probed), statistics.median(recalled)
        print(f"| {threads} | {scheme} | {a:.2f} | {b:.2f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
