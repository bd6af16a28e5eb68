"""Where the question goes: zero-shot CLINC150 10-domain routing under other prompt layouts.

The engine's layout puts the document first (the shared, cached prefix) and each question
after it (one suffix per question, all in one forward). On a small model that layout is at
chance for a 10-way choice however the options are labelled; this study measures whether the
model can route at all when the question and its options come *before* the document, so the
last thing it reads before answering is the request itself (as simple peers prompt). It reads
one plain full forward per record (``backend.reference_logits``), never the engine's fast path:
it is a design study, not a served format.

Rows: layout (document first / question first), template (the model's chat template / plain
text), what is read (the option letter, or the first token of each option's name; names are
read only where their first tokens differ).

    .venv/bin/python benchmarks/prompt_layouts.py --limit 100 [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

from onepass import prompt as P
from onepass.datasets import (
    CLINC_DOMAIN_DESCRIPTIONS,
    DOMAIN_QUESTION,
    clinc150_domain_routing,
    strip_answers,
)
from onepass.engine import DecisionEngine

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NAMES = list(CLINC_DOMAIN_DESCRIPTIONS)
LETTERS = P.LETTERS[: len(NAMES)]


def option_lines(read: str) -> str:
    if read == "letter":
        return "\n".join(f"{x}) {n}: {d}" for x, n, d in
                         zip(LETTERS, NAMES, CLINC_DOMAIN_DESCRIPTIONS.values()))
    return "\n".join(f"- {n}: {d}" for n, d in CLINC_DOMAIN_DESCRIPTIONS.items())


def build(layout: str, template: str, read: str, backend) -> Callable[[str], str]:
    """The whole prompt for one request; it ends where the answer's first token goes."""
    ask = f"Question: {DOMAIN_QUESTION}\nOptions:\n{option_lines(read)}"
    answer = f"Answer with the option's {read}."

    def user(state: str) -> str:
        document = f"<document>\n{state}\n</document>"
        parts = [document, ask] if layout == "document first" else [ask, document]
        return "\n\n".join(parts) + "\n" + answer

    if template == "plain":
        return lambda state: user(state) + "\n\nAnswer:"
    return lambda state: backend.render_chat([
        {"role": "system", "content": P.SYSTEM_INSTRUCTIONS},
        {"role": "user", "content": user(state)},
    ]) + "Answer:"


def accuracy(engine: DecisionEngine, records: list[dict], prompt: Callable[[str], str],
             read: str, label: str) -> float:
    backend = engine.backend
    words = LETTERS if read == "letter" else NAMES
    candidates = [backend.encode(" " + w, bos=False)[0] for w in words]
    if len(set(candidates)) != len(candidates):
        raise SystemExit(f"{label}: the options' first tokens are not distinct")
    right = 0
    for record in track(records, description=label, transient=True):
        logits = backend.reference_logits(backend.encode(prompt(record["state"])), candidates)
        gold = NAMES.index(record["questions"]["domain"]["answer"])
        right += logits.index(max(logits)) == gold
    return right / len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=100, help="CLINC150 test records")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=None, help="write results as JSON")
    args = parser.parse_args()

    engine = DecisionEngine.from_pretrained(args.model)
    records = clinc150_domain_routing(args.data, "test", args.limit, seed=1)
    start = time.perf_counter()
    results: dict[str, float] = {}
    right = 0
    for record in track(records, description="engine (shipped)", transient=True):
        request, gold = strip_answers(record)
        right += engine.answer(request)["answers"]["domain"]["choice"] == gold["domain"]
    results["engine, shipped format (document first, chat, letter)"] = right / len(records)
    for layout in ("document first", "question first"):
        for template in ("chat", "plain"):
            for read in ("letter", "name"):
                label = f"{layout}, {template}, {read}"
                results[label] = accuracy(
                    engine, records, build(layout, template, read, engine.backend), read, label)
                print(f"{label}: {results[label]:.3f}", flush=True)
    table = Table(title=f"CLINC150 10-domain routing, zero-shot, {engine.served_name}, "
                        f"{len(records)} test records (chance 0.10)")
    table.add_column("layout, template, read")
    table.add_column("accuracy", justify="right")
    for label, value in results.items():
        table.add_row(label, f"{value:.3f}")
    Console().print(table)
    print(f"seconds: {time.perf_counter() - start:.1f}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
