"""Real labelled data (CLINC150, BANKING77) as Jev-native records. Pure: no torch.

A Jev-native record is a System One request whose questions also carry the gold ``answer``::

    {"state": "...", "questions": {"domain": {"type": "choice", "instructions": "...",
                                              "criteria": {...}, "answer": "banking"}}}

Splits are the upstream ones (CLINC150 train/val/test, BANKING77 train/test); subsets are
drawn deterministically (stratified by label, seeded), so every script and test that asks for
``limit=200, seed=0`` gets the same records.
"""

from __future__ import annotations

import csv
import itertools
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CLINC_DOMAIN_DESCRIPTIONS = {
    "banking": "bank accounts, balances, transfers, bills, fraud, routing numbers",
    "credit_cards": "credit cards: limits, rewards, declines, lost or damaged cards, APR",
    "kitchen_and_dining": "cooking, recipes, ingredients, restaurants, nutrition, food",
    "home": "shopping and to-do lists, calendar, reminders, smart home devices",
    "auto_and_commute": "cars, gas, tires, oil, traffic, commute, directions, parking",
    "travel": "flights, hotels, trips, luggage, visas, exchange rates, travel alerts",
    "utility": "time, date, weather, alarms, timers, calculator, definitions, spelling",
    "work": "payroll, taxes, PTO, meetings, insurance, benefits at work",
    "small_talk": "greetings, jokes, chit-chat, questions about the assistant itself",
    "meta": "controlling the assistant: settings, language, voice, repeat, cancel, yes/no",
}

DOMAIN_QUESTION = "Which domain does the user's request belong to?"
IN_SCOPE_PROPOSITION = (
    "The request is something a personal assistant covering these areas can handle: "
    + "; ".join(CLINC_DOMAIN_DESCRIPTIONS.values())
    + "."
)
BANKING_QUESTION = "Which intent best describes the customer's message?"
MEMBERSHIP_PROPOSITION = "The user's request belongs to the domain {domain} ({description})."

# Small subsets in the upstream layout, shipped in the package (data/README.md: origin and
# licences) so the defaults work from a wheel with no full copy beside it.
PACKAGED_DATA_DIR = Path(__file__).resolve().parent / "data"
# the hand-written mixed noul / choice / score cases (a copy of benchmarks/data/handwritten.jsonl)
HANDWRITTEN_PROBES = PACKAGED_DATA_DIR / "handwritten.jsonl"


def _stratified(
    rows: Sequence[tuple[str, str]], limit: int | None, seed: int
) -> list[tuple[str, str]]:
    """Up to ``limit`` rows, balanced over labels, in a seeded but fixed order."""
    rows = list(rows)
    rng = random.Random(seed)
    rng.shuffle(rows)
    if limit is None or limit >= len(rows):
        return rows
    by_label: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in rows:
        by_label[row[1]].append(row)
    queues = [by_label[k] for k in sorted(by_label)]
    round_robin = [row for group in itertools.zip_longest(*queues) for row in group if row]
    picked = round_robin[:limit]
    rng.shuffle(picked)
    return picked


def _clinc(data_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    folder = Path(data_dir) / "clinc150"
    data = json.loads((folder / "data_full.json").read_text())
    domains = json.loads((folder / "domains.json").read_text())
    intent_domain = {intent: domain for domain, intents in domains.items() for intent in intents}
    return data, intent_domain


def clinc150_domain_routing(
    data_dir: Path, split: str = "test", limit: int | None = None, seed: int = 0,
    describe: bool = True,
) -> list[dict[str, Any]]:
    """10-way domain routing as a choice with one-line domain descriptions (``describe``) or
    the domain names alone (half the prompt)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split: expected train, val or test, got {split!r}")
    data, intent_domain = _clinc(data_dir)
    rows = [(text, intent_domain[intent]) for text, intent in data[split]]
    return [
        {
            "state": text,
            "questions": {
                "domain": {
                    "type": "choice",
                    "instructions": DOMAIN_QUESTION,
                    "criteria": dict(CLINC_DOMAIN_DESCRIPTIONS) if describe
                    else dict.fromkeys(CLINC_DOMAIN_DESCRIPTIONS),
                    "answer": domain,
                }
            },
        }
        for text, domain in _stratified(rows, limit, seed)
    ]


def clinc150_in_scope(
    data_dir: Path, split: str = "test", limit: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """In-scope vs out-of-scope as a noul, balanced between the two answers."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split: expected train, val or test, got {split!r}")
    data, _ = _clinc(data_dir)
    rows = [(text, "yes") for text, _ in data[split]]
    rows += [(text, "no") for text, _ in data[f"oos_{split}"]]
    return [
        {
            "state": text,
            "questions": {
                "in_scope": {
                    "type": "noul",
                    "instructions": IN_SCOPE_PROPOSITION,
                    "answer": answer,
                }
            },
        }
        for text, answer in _stratified(rows, limit, seed)
    ]


def clinc150_domain_membership(
    data_dir: Path, split: str = "test", limit: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """A yes/no question per request: "the request belongs to <domain>: <description>", about
    its own domain (answer yes) or a seeded other one (no), half each. Measures a noul's
    accuracy on real labels (the noul's yes-bias shows here, and what removes it)."""
    rows = clinc150_domain_routing(data_dir, split, limit, seed)
    rng = random.Random(seed)
    out = []
    for i, row in enumerate(rows):
        gold = row["questions"]["domain"]["answer"]
        asked = gold if i % 2 == 0 else rng.choice(
            [d for d in CLINC_DOMAIN_DESCRIPTIONS if d != gold])
        out.append({"state": row["state"], "questions": {"member": {
            "type": "noul",
            "instructions": MEMBERSHIP_PROPOSITION.format(
                domain=asked.replace("_", " "), description=CLINC_DOMAIN_DESCRIPTIONS[asked]),
            "answer": "yes" if asked == gold else "no",
        }}})
    return out


def banking77_intents(
    data_dir: Path, split: str = "test", limit: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """77-way intent choice (more options than 26 letters: exercises large-choice labels)."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected train or test, got {split!r}")
    folder = Path(data_dir) / "banking77"
    categories = json.loads((folder / "categories.json").read_text())
    with open(folder / f"{split}.csv", newline="", encoding="utf-8") as f:
        rows = [(r["text"], r["category"]) for r in csv.DictReader(f)]
    criteria = {c: c.replace("_", " ") for c in categories}
    return [
        {
            "state": text,
            "questions": {
                "intent": {
                    "type": "choice",
                    "instructions": BANKING_QUESTION,
                    "criteria": criteria,
                    "answer": category,
                }
            },
        }
        for text, category in _stratified(rows, limit, seed)
    ]


def probe_requests(data_dir: Path, handwritten: Path | None = None) -> list[dict[str, Any]]:
    """A fixed set of 100 real requests (answers stripped) for comparing two models' decisions:
    the hand-written mixed noul/choice/score cases when given (36), then CLINC150 test records
    up to 100, half domain routing (options by name), half in-scope."""
    records: list[dict[str, Any]] = []
    if handwritten is not None:
        records += [json.loads(line) for line in Path(handwritten).read_text().splitlines()
                    if line.strip()]
    records += clinc150_domain_routing(data_dir, "test", (100 - len(records)) // 2, seed=1,
                                       describe=False)
    records += clinc150_in_scope(data_dir, "test", 100 - len(records), seed=1)
    return [strip_answers(record)[0] for record in records]


def strip_answers(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Split a Jev-native record into a System One request and its gold answers."""
    questions = {}
    gold = {}
    for name, q in record["questions"].items():
        questions[name] = {k: v for k, v in q.items() if k != "answer"}
        gold[name] = q["answer"]
    return {"state": record["state"], "questions": questions}, gold


def write_jsonl(records: Iterable[dict[str, Any]], path: Path) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n
