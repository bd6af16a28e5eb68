"""Distil the quality model's decisions into the embedded one: the recipe, stage by stage.

The embedded SmolLM2-135M answers typed questions near chance; the 1.5B quality model does
better but costs ~6 GB and seconds a request. This script writes the recipe that moves the
teacher's *debiased* decision distributions into a LoRA adapter over the embedded base, at the
exact position the server reads (the trainer's soft targets)::

    mix       templated states and questions (scripts/distil_mix.py): a train split, and a
              held-out split of unseen domains and question wordings, gold answers by
              construction
    label     the teacher answers the mix's questions (llama.cpp, name order: no declared
              order moves its answer); resumable, one line per record
    build     the training set: where the teacher answered, a question's target is its
              distribution blended with the gold answer by --gold-weight (default 0.5: the gold
              stays every target's top answer, the teacher shapes the rest; 0: pure
              distillation); elsewhere the gold answer
    train     onepass train --method lora over the embedded base, the recipe in TRAIN_FLAGS
    evaluate  held-out accuracy of base, tuned adapter and teacher side by side

Every stage reads and writes under ``--work`` (default ``runs/distil``), so a stage can be rerun
alone. ``all`` runs them in order.

Where it stands (2026-12-07, this 2-core CPU; docs/training.md has the table): on 150 held-out
states (293 questions) the teacher answers 0.672, the base 0.392. The teacher reads ~30 tokens/s
here (7 s a state), so 187 of the 1,200 train states carry its targets. The TRAIN_FLAGS recipe
(one epoch, 535 steps, 38 minutes) did not learn: validation accuracy 0.374 -> 0.340, and the
fitted temperature hit its cap (the logits carry no signal). A choice-and-score-only run with 16
layers, rank 16 and learning rate 2e-3 diverged (train loss 3.09 against 2.06 untrained); at
learning rate 5e-4 it held steady but answered 0.348 held out. A gold-only run over 2,600
fresh states (one question each, LoRA on all 30 layers, rank 16, cosine from 7e-4) stayed flat
at a training loss of ~1.4 for 150 steps. No adapter ships until one beats the base on every
held-out measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import distil_mix  # beside this file: scripts/ is sys.path[0] when it runs as a script

ROOT = Path(__file__).resolve().parents[1]
TEACHER = "qwen2.5-coder-1.5b-instruct"
# name-order: any declared order reads the same prompt, at one reading per question. On this
# 2-core CPU the teacher reads ~30 tokens/s, so rotations (K readings a choice, a score's
# levels rotated) would cost 2.5-5x the labelling time; the gold blend below (build) keeps the
# teacher's leftover first-option habit from deciding any target's top answer.
TEACHER_DEBIAS = "name-order"
# the LoRA recipe (tests/test_train_learning's, which learns CLINC150 routing in one epoch)
TRAIN_FLAGS = ("--method", "lora", "--lora-rank", "8", "--lora-alpha", "16",
               "--lora-layers", "8", "--learning-rate", "1e-3", "--lr-schedule", "constant",
               "--warmup-steps", "10", "--batch-size", "4", "--seed", "0")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def unlabelled(record: dict[str, Any]) -> dict[str, Any]:
    """The request a model is asked: the record without its gold answers."""
    return {"state": record["state"],
            "questions": {name: {k: v for k, v in q.items() if k not in ("answer",
                                                                          "probabilities")}
                          for name, q in record["questions"].items()}}


def distribution(answer: dict[str, Any], question: dict[str, Any]) -> dict[str, float]:
    """An engine answer as a target, keyed as the dataset names candidates: noul yes/no, a
    choice's option keys, a score's level names (the answer's own order, which is theirs)."""
    from onepass.evaluate import answer_distribution

    names = ("yes", "no") if question["type"] == "noul" else tuple(question["criteria"])
    return dict(zip(names, answer_distribution(answer), strict=True))


def blend(teacher: dict[str, float], gold: str, gold_weight: float) -> dict[str, float]:
    """``(1 - w) * teacher + w * one-hot(gold)``, rounded so the file stays small."""
    out = {k: (1.0 - gold_weight) * p + (gold_weight if k == gold else 0.0)
           for k, p in teacher.items()}
    total = sum(out.values())
    return {k: round(p / total, 6) for k, p in out.items()}


# --------------------------------------------------------------------------- stages


def stage_mix(args: argparse.Namespace) -> None:
    for split, n in (("train", args.train_states), ("heldout", args.heldout_states)):
        items = distil_mix.generate(split, n, seed=args.seed)
        distil_mix.write(items, args.work / f"mix.{split}.jsonl")
        print(f"mix {split}: {len(items)} states, "
              f"{sum(len(i.record['questions']) for i in items)} questions")


def predictions(engine: Any, records: list[dict[str, Any]], debias: str, out: Path,
                description: str) -> list[dict[str, Any]]:
    """Each record's answers as distributions, appended line by line to ``out`` (resumable:
    the lines already there are kept and skipped)."""
    from rich.progress import Progress

    done = _read_jsonl(out) if out.exists() else []
    with out.open("a") as sink, Progress() as progress:
        task = progress.add_task(description, total=len(records), completed=len(done))
        for record in records[len(done):]:
            answers = engine.answer(unlabelled(record), debias=debias)["answers"]
            row = {name: distribution(answers[name], q)
                   for name, q in record["questions"].items()}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done.append(row)
            progress.advance(task)
    return done


def label(split: str, args: argparse.Namespace) -> Path:
    """The teacher's answers to one split of the mix (``teacher.<split>.jsonl``)."""
    from onepass.engine import DecisionEngine

    records = _read_jsonl(args.work / f"mix.{split}.jsonl")[: args.label_limit or None]
    out = args.work / f"teacher.{split}.jsonl"
    if out.exists() and len(_read_jsonl(out)) >= len(records):
        return out
    engine = DecisionEngine.from_pretrained(TEACHER, backend="llamacpp", n_threads=args.threads,
                                            n_ctx=4096)
    predictions(engine, records, TEACHER_DEBIAS, out, f"teacher on {split}")
    return out


def stage_label(args: argparse.Namespace) -> None:
    for split in args.splits.split(","):
        label(split, args)


def stage_build(args: argparse.Namespace) -> None:
    """train.jsonl: the teacher's blended targets where it answered, the gold elsewhere."""
    records = _read_jsonl(args.work / "mix.train.jsonl")
    path = args.work / "teacher.train.jsonl"
    teacher = _read_jsonl(path) if path.exists() else []
    rows = []
    for i, record in enumerate(records):
        questions = {}
        for name, q in record["questions"].items():
            if i < len(teacher):
                kept = {k: v for k, v in q.items() if k != "answer"}
                kept["probabilities"] = blend(teacher[i][name], q["answer"], args.gold_weight)
            else:
                kept = dict(q)
            questions[name] = kept
        rows.append({"state": record["state"], "questions": questions})
    _write_jsonl(args.work / "train.jsonl", rows)
    print(f"build: {len(rows)} records; the first {min(len(teacher), len(rows))} with the "
          f"teacher's targets (gold weight {args.gold_weight}), the rest with the gold answer")


def stage_train(args: argparse.Namespace) -> None:
    command = [str(ROOT / ".venv" / "bin" / "onepass"), "train", *TRAIN_FLAGS,
               "--dataset", str(args.work / "train.jsonl"), "--epochs", str(args.epochs),
               "--threads", str(args.threads), "--output-directory", str(args.work / "adapter")]
    print(" ".join(command))
    subprocess.run(command, check=True)


def accuracy(records: list[dict[str, Any]], answers: list[dict[str, Any]],
             meta: list[dict[str, Any]], heldout: frozenset[str]) -> dict[str, Any]:
    """Top answer against the gold: overall, per question type, per layout, and split by
    whether the domain was held out (else only the wording was)."""
    hits: dict[str, list[bool]] = {}
    for record, dists, info in zip(records, answers, meta):
        unseen = "unseen domain" if info["domain"] in heldout else "unseen wording"
        for name, q in record["questions"].items():
            dist = dists[name]
            hit = max(dist, key=dist.get) == q["answer"]
            for key in ("all", q["type"], info["layout"], unseen):
                hits.setdefault(key, []).append(hit)
    return {key: round(sum(v) / len(v), 3) for key, v in hits.items()} | {
        "questions": len(hits.get("all", []))}


def stage_evaluate(args: argparse.Namespace) -> None:
    """Held-out accuracy of the base, the tuned adapter (both float32, the default debias) and
    the teacher (its labels), side by side in evaluate.json."""
    import torch

    from onepass.engine import DecisionEngine

    torch.set_num_threads(args.threads)
    records = _read_jsonl(args.work / "mix.heldout.jsonl")[: args.eval_limit or None]
    meta = _read_jsonl(args.work / "mix.heldout.meta.jsonl")
    heldout = frozenset(distil_mix.HELDOUT_DOMAINS)
    report: dict[str, Any] = {}
    for name in args.models.split(","):
        adapter = {"base": None, "tuned": args.work / "adapter"}[name]
        out = args.work / f"answers.{name}.heldout.jsonl"
        engine = DecisionEngine.from_pretrained(dtype="float32", adapter=adapter)
        answers = predictions(engine, records, engine.debias, out, f"{name} on heldout")
        report[name] = accuracy(records, answers, meta, heldout)
    teacher = args.work / "teacher.heldout.jsonl"
    if teacher.exists():
        answers = _read_jsonl(teacher)[: len(records)]
        report["teacher"] = accuracy(records[: len(answers)], answers, meta, heldout)
    (args.work / "evaluate.json").write_text(json.dumps(report, indent=2))
    keys = list(next(iter(report.values())))
    print("| model | " + " | ".join(keys) + " |")
    for name, row in report.items():
        print(f"| {name} | " + " | ".join(str(row.get(k, "")) for k in keys) + " |")


STAGES = {"mix": stage_mix, "label": stage_label, "build": stage_build, "train": stage_train,
          "evaluate": stage_evaluate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=[*STAGES, "all"])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "distil")
    parser.add_argument("--train-states", type=int, default=1200)
    parser.add_argument("--heldout-states", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", default="train,heldout", help="label: which mix splits")
    parser.add_argument("--label-limit", type=int, default=0,
                        help="label: the first N records of each split (0: all)")
    parser.add_argument("--gold-weight", type=float, default=0.5)
    parser.add_argument("--eval-limit", type=int, default=0,
                        help="evaluate: the first N held-out records (0: all)")
    parser.add_argument("--models", default="base,tuned", help="evaluate: base, tuned or both")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    for stage in (STAGES if args.stage == "all" else [args.stage]):
        STAGES[stage](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
