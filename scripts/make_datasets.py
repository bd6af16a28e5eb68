"""Write Jev-native datasets (state + questions + gold answer) from the shared CLINC150 and
BANKING77 data, with fixed train / validation / test splits.

    python scripts/make_datasets.py [--data-dir ../shared/data] [--output-directory datasets]
                                    [--limit N] [--seed 0]

Writes, per task, ``<task>.train.jsonl``, ``<task>.validation.jsonl``, ``<task>.test.jsonl``:

* ``clinc150_domain``: 10-domain routing, a choice with one-line domain descriptions
  (upstream train / val / test);
* ``clinc150_in_scope``: in-scope vs out-of-scope, a noul (upstream splits, balanced draw);
* ``banking77_intent``: 77-way intent choice (upstream test; validation is a fixed,
  stratified 10 % of upstream train, disjoint from the train file).

Splits are deterministic: the same ``--seed`` and ``--limit`` always give the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from onepass.datasets import (  # noqa: E402
    banking77_intents,
    clinc150_domain_routing,
    clinc150_in_scope,
    write_jsonl,
)


def banking_splits(data_dir: Path, seed: int) -> tuple[list[dict], list[dict]]:
    """BANKING77 has no upstream validation split: hold out every 10th record per intent."""
    records = banking77_intents(data_dir, "train", None, seed)
    seen: dict[str, int] = defaultdict(int)
    train, validation = [], []
    for record in records:
        answer = record["questions"]["intent"]["answer"]
        (validation if seen[answer] % 10 == 0 else train).append(record)
        seen[answer] += 1
    return train, validation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--output-directory", default="datasets")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most N records per split (a fixed draw, balanced over "
                        "labels where the upstream split allows; default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data, out, limit, seed = Path(args.data_dir), Path(args.output_directory), args.limit, args.seed
    if not (data / "clinc150").is_dir():
        parser.error(f"no CLINC150 data under {data}")

    def cap(records: list[dict]) -> list[dict]:
        return records if limit is None else records[:limit]

    splits = {
        "clinc150_domain": {
            name: clinc150_domain_routing(data, upstream, limit, seed)
            for name, upstream in (("train", "train"), ("validation", "val"), ("test", "test"))
        },
        "clinc150_in_scope": {
            name: clinc150_in_scope(data, upstream, limit, seed)
            for name, upstream in (("train", "train"), ("validation", "val"), ("test", "test"))
        },
    }
    if (data / "banking77").is_dir():
        train, validation = banking_splits(data, seed)
        splits["banking77_intent"] = {
            "train": cap(train),
            "validation": cap(validation),
            "test": banking77_intents(data, "test", limit, seed),
        }
    counts = {}
    for task, parts in splits.items():
        for split, records in parts.items():
            path = out / f"{task}.{split}.jsonl"
            counts[str(path)] = write_jsonl(records, path)
    print(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
