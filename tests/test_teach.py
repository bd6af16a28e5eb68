"""Teach by example: K labelled examples per option as a pinned system context."""

from __future__ import annotations

import json

import pytest

from onepass.cli import main
from onepass.datasets import clinc150_domain_routing, write_jsonl
from onepass.teach import parse_context, render_context, select_examples
from onepass.train.dataset import load_dataset, parse_record


def _records(rows):
    raws = [{"state": s, "questions": {"q": {"type": "choice", "instructions": "Which?",
                                             "criteria": {"a": None, "b": None, "c": None},
                                             "answer": a}}} for s, a in rows]
    return [parse_record(raw, "mem", i) for i, raw in enumerate(raws, start=1)]


def test_select_k_per_label_in_declared_order_and_round_trip():
    rows = [(f"text {i} about a", "a") for i in range(5)] + [
        ('b with "quotes"\nand a newline', "b"), ("b two", "b"), ("b three", "b")]
    examples = select_examples(_records(rows), 2, seed=3)
    pairs = examples["Which?"]
    assert [a for _, a in pairs] == ["a", "a", "b", "b"]  # no gold "c": none invented
    assert select_examples(_records(rows), 2, seed=3) == examples  # seeded: the same
    text = render_context(examples)
    assert parse_context(text) == examples
    assert text.startswith("Labelled examples")
    with pytest.raises(ValueError):
        select_examples(_records(rows), 0)


def test_teach_command_on_clinc150(tmp_path, data_dir):
    dataset = tmp_path / "train.jsonl"
    write_jsonl(clinc150_domain_routing(data_dir, "train", limit=200, seed=0, describe=False),
                dataset)
    out = tmp_path / "context.md"
    assert main(["teach", "--dataset", str(dataset), "--output", str(out),
                 "--per-label", "2"]) == 0
    examples = parse_context(out.read_text())
    (pairs,) = examples.values()
    assert len(pairs) == 20
    counts = {a: sum(1 for _, x in pairs if x == a) for _, a in pairs}
    assert set(counts.values()) == {2} and len(counts) == 10
    records = load_dataset(dataset)
    gold = {r.request.state: r.request.questions[0].options[r.answers[0]] for r in records}
    assert all(gold[s] == a for s, a in pairs)  # every example carries its own gold answer
    # served as the system context, inside the system turn the engine pins at start-up
    from onepass.prompt import system_text

    assert json.dumps(pairs[0][0], ensure_ascii=False) in system_text(out.read_text())
