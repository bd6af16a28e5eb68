"""onepass against fastjev 0.2.0's prompt on the same checkpoint and questions, in one run: top-
answer accuracy on the distillation mix's held-out split (``scripts/distil_embedded.py mix``:
unseen domains and unseen wordings, gold answers right by construction), per question type.

fastjev is read as it reads a System One request itself: its own wire adapter
(``fastjev.compat.wire.request_rows``) turns each question into its scorer row, and its own
direct scorer (``fastjev._runtime.direct.score``: one JSON user message of evidence, criterion
and lettered option descriptions, the letter tokens read at the last position) scores it on the
same float32 transformers model onepass loads. fastjev takes at most 16 options, so questions
with more are left out of both columns (and counted). onepass answers with its defaults.

fastjev is a peer, not a dependency: ``.venv/bin/pip install --no-deps fastjev==0.2.0``.

    .venv/bin/python benchmarks/peer_fastjev.py [--mix runs/distil/mix.heldout.jsonl]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from prompt_formats import predicted  # benchmarks/ is sys.path[0] when run as a script
from rich.progress import track

ROOT = Path(__file__).resolve().parents[1]


def fastjev_row(state: object, question: dict) -> tuple[dict, list[str]] | None:
    """fastjev's scorer row for one question and its option ids, or None where it refuses it."""
    from fastjev.compat.wire import SystemOneValidationError, request_rows

    asked = {k: v for k, v in question.items() if k != "answer"}
    try:
        specs, rows = request_rows({"model": "m", "state": state, "questions": {"q": asked}}, "m")
    except SystemOneValidationError:
        return None
    return rows[0], list(specs[0].option_ids)


def fastjev_gold(question: dict) -> str:
    """The gold answer as fastjev names its options (noul true/false, score the level index)."""
    if question["type"] == "noul":
        return {"yes": "true", "no": "false"}[question["answer"]]
    if question["type"] == "score":
        return str(question["criteria"].index(question["answer"]))
    return question["answer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", type=Path, default=ROOT / "runs/distil/mix.heldout.jsonl")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from fastjev._runtime.direct import score

    from onepass.engine import DecisionEngine

    torch.set_num_threads(args.threads)
    records = [json.loads(line) for line in args.mix.read_text().splitlines() if line.strip()]
    engine = DecisionEngine.from_pretrained(dtype="float32")
    model, tokenizer = engine.backend.model, engine.backend.tokenizer  # the same weights
    hits: dict[str, dict[str, list[bool]]] = {"onepass": defaultdict(list),
                                              "fastjev": defaultdict(list)}
    refused = 0
    for record in track(records, description="held-out states"):
        kept = {}
        for name, question in record["questions"].items():
            converted = fastjev_row(record["state"], question)
            if converted is None:
                refused += 1
                continue
            row, ids = converted
            with torch.inference_mode():
                p = score(model, tokenizer, row, {})["probabilities"]
            right = ids[p.index(max(p))] == fastjev_gold(question)
            for key in ("all", question["type"]):
                hits["fastjev"][key].append(right)
            kept[name] = question
        if not kept:
            continue
        request = {"state": record["state"],
                   "questions": {n: {k: v for k, v in q.items() if k != "answer"}
                                 for n, q in kept.items()}}
        answers = engine.answer(request)["answers"]
        for name, question in kept.items():
            right = predicted(answers[name]) == question["answer"]
            for key in ("all", question["type"]):
                hits["onepass"][key].append(right)
    keys = ("all", "noul", "choice", "score")
    print(f"{args.mix.name}: {len(hits['onepass']['all'])} questions "
          f"({refused} with over 16 options left out: fastjev refuses them)")
    print("| reader | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for reader, table in hits.items():
        cells = [f"{sum(table[k]) / len(table[k]):.3f} ({len(table[k])})" if table[k] else "–"
                 for k in keys]
        print(f"| {reader} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
