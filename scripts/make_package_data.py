"""Write the small CLINC150 / BANKING77 subsets shipped inside the package (src/onepass/data).

    python scripts/make_package_data.py [--data-dir ../shared/data] [--output src/onepass/data]

A wheel installed without ../shared/data beside it reads these for its defaults: fp4's GPTQ
calibration prompts (``onepass quantize --quantization fp4``), the ``quantize --report``
probes and ``onepass bench``'s records. The files keep the upstream layout (what
:mod:`onepass.datasets` reads), so every reader works on them unchanged; each label keeps the
first rows of a seeded shuffle, in upstream order. Enough rows for every default: bench's
500-record CLINC150 teaching pool (60 train rows a domain), its 100-record fit and test sets
(CLINC150 val 150 / test 300, BANKING77's ten bench intents 40 train / 10 test rows each),
the 32 calibration prompts and the 100 probes. Tests and benchmarks keep the full sets.
Deterministic: rerunning writes the same bytes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import shutil
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from onepass.bench import BANKING_SUBSET  # noqa: E402

OUT = ROOT / "src" / "onepass" / "data"
# rows kept per label (CLINC150: per intent; out-of-scope rows as one label)
CLINC_PER_INTENT = {"train": 4, "val": 1, "test": 2}
CLINC_OOS = {"oos_train": 50, "oos_val": 50, "oos_test": 100}
BANKING_PER_CATEGORY = {"train": (40, 4), "test": (10, 2)}  # (bench intents, the others)


def keep(rows: list, label, counts, seed: int = 0) -> list:
    """The first ``counts(label)`` rows of each label after a seeded shuffle, in file order."""
    by: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by[label(row)].append(i)
    chosen: set[int] = set()
    for name in sorted(by):
        picks = list(by[name])
        random.Random(f"{seed}:{name}").shuffle(picks)
        chosen.update(picks[:counts(name)])
    return [row for i, row in enumerate(rows) if i in chosen]


def clinc(source: Path, target: Path) -> dict[str, int]:
    data = json.loads((source / "data_full.json").read_text())
    out = {}
    for split, rows in data.items():
        if split in CLINC_OOS:
            out[split] = keep(rows, lambda r: "oos", lambda _, n=CLINC_OOS[split]: n)
        else:
            out[split] = keep(rows, lambda r: r[1], lambda _, n=CLINC_PER_INTENT[split]: n)
    target.mkdir(parents=True, exist_ok=True)
    (target / "data_full.json").write_text(json.dumps(out, ensure_ascii=False) + "\n")
    for name in ("domains.json", "LICENSE"):
        shutil.copyfile(source / name, target / name)
    return {split: len(rows) for split, rows in out.items()}


def banking(source: Path, target: Path) -> dict[str, int]:
    target.mkdir(parents=True, exist_ok=True)
    counts = {}
    bench = set(BANKING_SUBSET)
    for split, (inside, outside) in BANKING_PER_CATEGORY.items():
        with open(source / f"{split}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        rows = keep(rows, lambda r: r["category"],
                    lambda c, a=inside, b=outside: a if c in bench else b)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=["text", "category"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        (target / f"{split}.csv").write_text(text.getvalue(), encoding="utf-8")
        counts[split] = len(rows)
    for name in ("categories.json", "LICENSE"):
        shutil.copyfile(source / name, target / name)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    if not (args.data_dir / "clinc150").is_dir():
        print(f"no datasets at {args.data_dir} (--data-dir)", file=sys.stderr)
        return 2
    print("clinc150", clinc(args.data_dir / "clinc150", args.output / "clinc150"))
    print("banking77", banking(args.data_dir / "banking77", args.output / "banking77"))
    shutil.copyfile(ROOT / "benchmarks" / "data" / "handwritten.jsonl",
                    args.output / "handwritten.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
