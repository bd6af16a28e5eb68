"""Choose the prompt format by measurement: zero-shot accuracy of each format on real data.

Sets: the hand-written mixed noul/choice/score cases (benchmarks/data/handwritten.jsonl),
CLINC150 10-domain routing (choice) and CLINC150 in-scope vs out-of-scope (noul), test split,
stratified samples. A "naive peer" row reads the same model the way simple peers do: no chat
template, one question at a time, the first token of each option's name after "Answer:".

    .venv/bin/python benchmarks/prompt_formats.py --limit 100
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

from onepass import prompt as P
from onepass.datasets import clinc150_domain_routing, clinc150_in_scope, strip_answers
from onepass.engine import DecisionEngine

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"


def predicted(answer: dict) -> str:
    if answer["type"] == "noul":
        return "yes" if answer["noul"] >= 0.5 else "no"
    if answer["type"] == "choice":
        return answer["choice"]
    probs = answer["probabilities"]
    return answer["legend"][max(probs, key=probs.get)]


def gold_of(question: dict, gold: str) -> str:
    if question["type"] == "noul":
        return {"true": "yes", "false": "no"}.get(gold, gold)
    return gold


def accuracy(engine: DecisionEngine, records: list[dict], label: str) -> float:
    right = 0
    for record in track(records, description=label, transient=True):
        request, gold = strip_answers(record)
        answers = engine.answer(request)["answers"]
        for name, g in gold.items():
            right += predicted(answers[name]) == gold_of(request["questions"][name], g)
    return right / sum(len(r["questions"]) for r in records)


def naive_peer(engine: DecisionEngine, records: list[dict], label: str) -> float:
    """One plain prompt per question; read the first token of each option name."""
    backend = engine.backend
    right = 0
    for record in track(records, description=label, transient=True):
        request, gold = strip_answers(record)
        for name, q in request["questions"].items():
            if q["type"] == "noul":
                names = ["yes", "no"]
                text = f"{P.render_content(request['state'])}\nIs this true: {q['instructions']}"
            elif q["type"] == "choice":
                names = list(q["criteria"])
                text = (f"{P.render_content(request['state'])}\n{q['instructions']}\n"
                        f"Options: {', '.join(names)}")
            else:
                names = [str(x) for x in q["criteria"]]
                text = (f"{P.render_content(request['state'])}\n{q['instructions']}\n"
                        f"Levels: {', '.join(names)}")
            ids = backend.encode(text + "\nAnswer:")
            firsts = [backend.encode(" " + n, bos=False)[0] for n in names]
            logits = backend.reference_logits(ids, firsts)
            best = names[max(range(len(names)), key=lambda i: logits[i])]
            right += best == gold_of(q, gold[name])
    return right / sum(len(r["questions"]) for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=100, help="CLINC150 examples per set")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's); 1 is steadier when busy")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base = DecisionEngine.from_pretrained(args.model)
    hand = [json.loads(x) for x in (HERE / "data" / "handwritten.jsonl").read_text().splitlines()]
    sets = {
        "mixed (hand-written)": hand,
        "clinc domain (choice)": clinc150_domain_routing(args.data, "test", args.limit, seed=1),
        "clinc in-scope (noul)": clinc150_in_scope(args.data, "test", args.limit, seed=1),
    }
    chat = base.format
    formats = {
        "letters, chat template (shipped)": dict(style=P.Style(), chat_format=chat),
        "Yes/No words for noul": dict(style=P.Style(noul_words=True), chat_format=chat),
        "digits for score levels": dict(style=P.Style(score_digits=True), chat_format=chat),
        "'Answer:' opens the reply": dict(style=P.Style(lead="Answer:"), chat_format=chat),
        "letters, no option names": dict(style=P.Style(option_names=False), chat_format=chat),
        "letters, plain (no chat)": dict(style=P.Style(), chat_format=P.PLAIN_FORMAT),
    }
    results: dict[str, dict[str, float]] = {}
    start = time.perf_counter()
    for fname, kwargs in formats.items():
        engine = DecisionEngine(base.backend, **kwargs)
        results[fname] = {s: accuracy(engine, recs, f"{fname} · {s}") for s, recs in sets.items()}
        print(fname, results[fname], flush=True)
    naive = "naive peer (one plain prompt per question)"
    results[naive] = {s: naive_peer(base, recs, f"naive · {s}") for s, recs in sets.items()}
    print(naive, results[naive], flush=True)
    table = Table(title=f"zero-shot accuracy, {base.served_name}, {args.limit} CLINC examples/set")
    table.add_column("format")
    for s in sets:
        table.add_column(s, justify="right")
    table.add_column("mean", justify="right")
    for fname, row in results.items():
        mean = sum(row.values()) / len(row)
        table.add_row(fname, *(f"{row[s]:.3f}" for s in sets), f"{mean:.3f}")
        row["mean"] = mean
    Console().print(table)
    print(f"seconds: {time.perf_counter() - start:.1f}")
    best = max((k for k in results if not k.startswith("naive")), key=lambda k: results[k]["mean"])
    print(f"best format: {best}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    assert all(math.isfinite(v) for row in results.values() for v in row.values())


if __name__ == "__main__":
    main()
