"""Jev-native datasets: System One requests whose questions also carry the gold ``answer``, or
a target distribution ``probabilities`` (distillation: a teacher's answer, one probability per
candidate, named as an ``answer`` would be).

Accepted files (extension case-insensitive): ``.jsonl`` (one record per line), ``.json`` holding
one record or an array of records. Every problem is a :class:`DatasetError` naming the file and
the line (for a JSON array, the line where the offending record starts), so a broken dataset is
fixable without guesswork. Validation reuses :func:`onepass.contract.parse_request`, so a record
the trainer accepts is a request the server accepts, plus an answer that is one of its
candidates.

Pure: no torch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onepass.contract import ContractError, DecisionRequest, Question, parse_request

RECORD_KEYS = ("state", "questions")
QUESTION_KEYS = ("type", "instructions", "criteria", "answer", "probabilities")
TARGET_KEYS = ("answer", "probabilities")
PROBABILITY_SUM_TOLERANCE = 1e-3  # a teacher's rounded probabilities still name a distribution


class DatasetError(ValueError):
    """A record that cannot be trained on: ``file:line: message``."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Record:
    """One validated record: the request the server would see and the gold option indices.

    ``answers[i]`` is the index into ``request.questions[i].options`` of the gold answer (a
    target distribution's first most probable option); ``distributions[i]`` the target
    distribution over those options, or None for a gold answer.
    """

    request: DecisionRequest
    answers: tuple[int, ...]
    source: str  # "file:line", for messages
    raw: dict[str, Any]
    distributions: tuple[tuple[float, ...] | None, ...] = ()

    @property
    def questions(self) -> tuple[Question, ...]:
        return self.request.questions


def _describe(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:80]


def answer_index(question: Question, answer: Any) -> int:
    """Index of ``answer`` among the question's candidates, or ValueError saying what is allowed.

    noul: ``yes``/``no`` (``true``/``false`` when declared so; case-insensitive) or the custom
    label text declared in ``criteria``; choice: an option key; score: a level name.
    """
    if question.type == "noul":
        if isinstance(answer, str):
            low = answer.strip().lower()
            for i, option in enumerate(question.options):
                if low == option:
                    return i
            for i, desc in enumerate(question.descriptions):
                if isinstance(desc, str) and answer.strip() == desc.strip():
                    return i
        allowed = list(question.options) + [
            d for d in question.descriptions if isinstance(d, str)
        ]
        raise ValueError(f"expected one of {allowed}, got {_describe(answer)}")
    if question.type == "choice":
        if isinstance(answer, str) and answer in question.options:
            return question.options.index(answer)
        raise ValueError(
            f"expected an option name, one of {list(question.options)}, got {_describe(answer)}"
        )
    for i, level in enumerate(question.descriptions):
        if answer == level:
            return i
    raise ValueError(
        f"expected a level name, one of {list(question.descriptions)}, got {_describe(answer)}"
    )


def target_distribution(question: Question, probabilities: Any) -> tuple[float, ...]:
    """``probabilities`` (one finite, non-negative number per candidate, keyed as an
    ``answer`` names it, summing to 1) in the question's option order, normalised; or
    ValueError naming the offending key."""
    if not isinstance(probabilities, dict) or not probabilities:
        raise ValueError(f"expected an object of probabilities by option, got "
                         f"{_describe(probabilities)}")
    out: list[float | None] = [None] * len(question.options)
    for key, value in probabilities.items():
        try:
            index = answer_index(question, key)
        except ValueError as exc:
            raise ValueError(f"key {_describe(key)}: {exc}") from None
        if out[index] is not None:
            raise ValueError(f"key {_describe(key)}: names an option already given")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0.0 <= value <= 1.0):
            raise ValueError(f"{key}: expected a probability in [0, 1], got {_describe(value)}")
        out[index] = float(value)
    missing = [o for o, p in zip(question.options, out) if p is None]
    if missing:
        raise ValueError(f"missing a probability for {missing[0]!r}: every candidate needs one")
    total = sum(out)  # type: ignore[arg-type]
    if abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
        raise ValueError(f"the probabilities sum to {total:.6g}, not 1 "
                         f"(tolerance {PROBABILITY_SUM_TOLERANCE})")
    return tuple(p / total for p in out)  # type: ignore[operator]


def parse_record(raw: Any, path: str | Path, line: int | None) -> Record:
    """Validate one decoded record (see the module docstring for the rules)."""

    def fail(message: str) -> DatasetError:
        return DatasetError(path, line, message)

    if not isinstance(raw, dict):
        raise fail(f"expected a record object with 'state' and 'questions', got {_describe(raw)}")
    unknown = sorted(set(raw) - set(RECORD_KEYS))
    if unknown:
        raise fail(f"unknown key {unknown[0]!r}; a record has only 'state' and 'questions'")
    questions = raw.get("questions")
    if isinstance(questions, dict):
        for name, q in questions.items():
            if not isinstance(q, dict):
                continue  # parse_request names the problem
            extra = sorted(set(q) - set(QUESTION_KEYS))
            if extra:
                raise fail(
                    f"questions.{name}: unknown key {extra[0]!r}; a question is the contract "
                    "shape ('type', 'instructions', 'criteria') plus 'answer' or 'probabilities'"
                )
            given = [k for k in TARGET_KEYS if k in q]
            if not given:
                raise fail(f"questions.{name}: missing 'answer' (or 'probabilities')")
            if len(given) > 1:
                raise fail(f"questions.{name}: give 'answer' or 'probabilities', not both")
        stripped = {
            name: ({k: v for k, v in q.items() if k not in TARGET_KEYS}
                   if isinstance(q, dict) else q)
            for name, q in questions.items()
        }
    else:
        stripped = questions
    try:
        request = parse_request({"state": raw.get("state"), "questions": stripped}
                                if "state" in raw else {"questions": stripped})
    except ContractError as exc:
        raise fail(str(exc)) from None
    answers, distributions = [], []
    for q in request.questions:
        given = questions[q.name]
        key = "answer" if "answer" in given else "probabilities"
        try:
            if key == "answer":
                answers.append(answer_index(q, given["answer"]))
                distributions.append(None)
            else:
                p = target_distribution(q, given["probabilities"])
                answers.append(p.index(max(p)))
                distributions.append(p)
        except ValueError as exc:
            raise fail(f"questions.{q.name}.{key}: {exc}") from None
    return Record(request, tuple(answers), f"{path}:{line}" if line else str(path), raw,
                  tuple(distributions))


def _json_array_lines(text: str, path: Path) -> list[tuple[Any, int]]:
    """Decode a JSON array element by element, keeping the line each element starts on."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    items: list[tuple[Any, int]] = []

    def skip(p: int) -> int:
        while p < len(text) and text[p] in " \t\r\n":
            p += 1
        return p

    def line_of(p: int) -> int:
        return text.count("\n", 0, p) + 1

    pos = skip(pos)
    if pos < len(text) and text[pos] == "]":
        return items
    while True:
        pos = skip(pos)
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
        items.append((value, line_of(pos)))
        pos = skip(end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        if pos < len(text) and text[pos] == "]":
            if skip(pos + 1) != len(text):
                raise DatasetError(path, line_of(pos + 1), "unexpected data after the array")
            return items
        raise DatasetError(path, line_of(pos), "invalid JSON: expected ',' or ']' in the array")


def load_dataset(path: str | Path) -> list[Record]:
    """Read and validate a dataset file; raises :class:`DatasetError` on the first problem."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json"):
        raise DatasetError(path, None, "expected a .jsonl or .json file (any letter case)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(path, None, "file not found") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(path, None, f"not UTF-8 text ({exc.reason})") from None
    records: list[Record] = []
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    path, number, f"invalid JSON: {exc.msg} at column {exc.colno}"
                ) from None
            records.append(parse_record(raw, path, number))
    else:
        stripped = text.lstrip()
        if stripped.startswith("["):
            for raw, number in _json_array_lines(text, path):
                records.append(parse_record(raw, path, number))
        else:
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
            start = text.count("\n", 0, len(text) - len(stripped)) + 1
            records.append(parse_record(raw, path, start))
    if not records:
        raise DatasetError(path, None, "no records: the dataset is empty")
    return records


def split_records(
    records: Sequence[Record], fraction: float, seed: int, path: str | Path
) -> tuple[list[Record], list[Record]]:
    """A fixed (seeded) hold-out of ``fraction`` of the records of ``path``: (train, validation).

    A split that cannot be made is a :class:`DatasetError` naming ``path``, like every other
    dataset problem.
    """
    if not 0.0 < fraction < 1.0:
        raise DatasetError(
            path, None, f"validation split: expected a fraction between 0 and 1, got {fraction}"
        )
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(records) * fraction))
    if n_val >= len(records):
        raise DatasetError(
            path, None,
            f"validation split {fraction} of {len(records)} records leaves nothing to train on; "
            "add records, lower --validation-split or give --validation-dataset",
        )
    held = set(order[:n_val])
    train = [r for i, r in enumerate(records) if i not in held]
    val = [r for i, r in enumerate(records) if i in held]
    return train, val
