"""Teach by example: K labelled examples per option, written as a system context. Pure.

The context is prefilled once at start-up and pinned (``--context-path``), so the examples cost
nothing per request. Answers are written by option *name*, never by label letter: the letters
move with the option order (and with ``debias=rotations``), the names do not. States are written
as JSON strings so any text (quotes, newlines) reads back exactly (:func:`parse_context`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

HEADER = "Labelled examples: documents like the ones you will see, with the correct answer."
ARROW = " -> "


def select_examples(records: Sequence[Any], per_label: int, seed: int = 0
                    ) -> dict[str, list[tuple[str, str]]]:
    """Per question instructions: up to ``per_label`` (state, answer name) pairs per option,
    drawn in a seeded order, options in declared order, shortest states first among the drawn
    (short examples teach the boundary at less prompt)."""
    if per_label < 1:
        raise ValueError(f"per_label must be >= 1, got {per_label}")
    rng = random.Random(seed)
    order = list(range(len(records)))
    rng.shuffle(order)
    pools: dict[str, dict[str, list[str]]] = {}
    options: dict[str, tuple[str, ...]] = {}
    for i in order:
        record = records[i]
        state = record.request.state
        if not isinstance(state, str):
            state = json.dumps(state, ensure_ascii=False, sort_keys=True)
        for question, gold in zip(record.request.questions, record.answers):
            if question.type == "score":
                names = tuple(str(d) for d in question.descriptions)
            else:
                names = question.options
            key = _instructions(question.instructions)
            options.setdefault(key, names)
            pools.setdefault(key, {}).setdefault(names[gold], []).append(state)
    out: dict[str, list[tuple[str, str]]] = {}
    for key, by_answer in pools.items():
        chosen = []
        for name in options[key]:
            drawn = sorted(by_answer.get(name, [])[: per_label * 4], key=len)[:per_label]
            chosen += [(state, name) for state in drawn]
        out[key] = chosen
    return out


def _instructions(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_context(examples: dict[str, list[tuple[str, str]]]) -> str:
    """The context text: one block per question, one line per example."""
    lines = [HEADER]
    for question, pairs in examples.items():
        lines += ["", f"Question: {question}"]
        lines += [f"- {json.dumps(state, ensure_ascii=False)}{ARROW}{answer}"
                  for state, answer in pairs]
    return "\n".join(lines) + "\n"


def parse_context(text: str) -> dict[str, list[tuple[str, str]]]:
    """The examples back from :func:`render_context`'s text."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    decoder = json.JSONDecoder()
    for line in text.splitlines():
        if line.startswith("Question: "):
            current = out.setdefault(line[len("Question: "):], [])
        elif line.startswith("- ") and current is not None:
            state, end = decoder.raw_decode(line, 2)
            if not line[end:].startswith(ARROW):
                raise ValueError(f"not an example line: {line!r}")
            current.append((state, line[end + len(ARROW):]))
    return out
