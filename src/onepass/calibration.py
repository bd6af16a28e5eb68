"""Calibration: make the served probabilities mean what they say. No torch.

A small model's restricted softmax is biased (it favours some options whatever the state) and
mis-scaled (over- or under-confident). ``onepass calibrate`` fits, from labelled Jev-native
records, a correction applied to every answer's distribution in declared order::

    p'_k ∝ exp(log p_k / T + b_k)

* ``content-free``: ``b_k = -log p̄_k`` where ``p̄`` is the model's mean answer for the same
  question about content-free states (``N/A``, ``[MASK]``, …); no labels needed, ``T = 1``;
* ``fit``: ``T`` and ``b`` minimise the held-in negative log-likelihood (``b`` L2-regularised);
* ``both``: the content-free ``b``, then ``T`` fitted;
* ``auto`` (the default): each of the three fitted on a seeded 70% and the one with the lowest
  negative log-likelihood on the other 30% kept (ties: the simplest).

``b`` and ``T`` are per question (its type, instructions and options); questions the file has
not seen get the per-type temperature. The file records the model, dtype, adapter and prompt
version it was fitted for; :meth:`Calibration.check` refuses any other. It can also carry an
abstention threshold fitted for a target error rate (:func:`fit_abstention`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "onepass-calibration-1"
METHODS = ("content-free", "fit", "both")
CONTENT_FREE_STATES = ("N/A", "[MASK]", "-", "nothing")
IDENTITY_KEYS = ("model", "dtype", "adapter", "prompt_version")


class CalibrationError(ValueError):
    """A calibration file that does not fit what is loaded, or is not one."""


def question_key(question: Any) -> str:
    """Identifies a question across requests: type, instructions and the (name, description)
    pairs in canonical order, so reordering the options keeps the key."""
    options = sorted(zip(question.options, (json.dumps(d, sort_keys=True) for d in
                                             question.descriptions)))
    text = json.dumps([question.type, question.instructions, options], sort_keys=True,
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class QuestionCorrection:
    """``T`` and per-option ``b`` (by option name) for one question."""

    name: str
    type: str
    temperature: float
    bias: dict[str, float]


@dataclass
class Calibration:
    """A fitted correction plus what it was fitted for (see the module docstring)."""

    identity: dict[str, Any]
    method: str
    debias: str = "none"
    questions: dict[str, QuestionCorrection] = field(default_factory=dict)
    type_temperature: dict[str, float] = field(default_factory=dict)
    abstain_below: float | None = None
    report: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ use

    def apply(self, question: Any, probabilities: Sequence[float]) -> list[float]:
        """The corrected distribution of ``question`` (declared order)."""
        fit = self.questions.get(question_key(question))
        if fit is not None:
            bias = [fit.bias.get(o, 0.0) for o in question.options]
            return _transform(probabilities, fit.temperature, bias)
        temperature = self.type_temperature.get(question.type)
        if temperature is None:
            return list(probabilities)
        return _transform(probabilities, temperature, [0.0] * len(probabilities))

    def check(self, identity: dict[str, Any]) -> None:
        """Refuse a file fitted for another model, dtype, adapter or prompt version."""
        wrong = [k for k in IDENTITY_KEYS if self.identity.get(k) != identity.get(k)]
        if wrong:
            said = "; ".join(f"{k}: file {self.identity.get(k)!r}, loaded {identity.get(k)!r}"
                             for k in wrong)
            raise CalibrationError(
                f"calibration does not match what is loaded ({said}); refit it with "
                "onepass calibrate for this model"
            )

    # ------------------------------------------------------------------ file

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            **{k: self.identity.get(k) for k in IDENTITY_KEYS},
            "method": self.method,
            "debias": self.debias,
            "type_temperature": self.type_temperature,
            "questions": {k: vars(v) for k, v in self.questions.items()},
            "abstain_below": self.abstain_below,
            "report": self.report,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{path}: not a readable calibration file ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CalibrationError(f"{path}: not a calibration file (format {FORMAT!r} "
                                   "expected); make one with onepass calibrate")
        return cls(
            identity={k: raw.get(k) for k in IDENTITY_KEYS},
            method=raw["method"],
            debias=raw.get("debias", "none"),
            questions={k: QuestionCorrection(**v) for k, v in raw.get("questions", {}).items()},
            type_temperature=dict(raw.get("type_temperature", {})),
            abstain_below=raw.get("abstain_below"),
            report=raw.get("report", {}),
        )


def _transform(probabilities: Sequence[float], temperature: float, bias: Sequence[float]
               ) -> list[float]:
    logs = [math.log(max(p, 1e-300)) / temperature + b for p, b in zip(probabilities, bias)]
    top = max(logs)
    exps = [math.exp(x - top) for x in logs]
    total = sum(exps)
    return [e / total for e in exps]


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Sample:
    """One answered question: its parsed question, the gold index and the served
    (uncalibrated) distribution in declared order."""

    question: Any
    gold: int
    probabilities: tuple[float, ...]


def collect(engine: Any, records: Sequence[Any], *, debias: str | None = None,
            on_record: Callable[[int], None] | None = None) -> list[Sample]:
    """Answer every record with ``engine`` (calibration off) and keep the distributions."""
    saved, engine.calibration = engine.calibration, None
    try:
        samples = []
        for i, record in enumerate(records):
            answers = engine.answer(record.request, debias=debias)["answers"]
            for question, gold in zip(record.request.questions, record.answers):
                if question.is_trivial:
                    continue
                samples.append(Sample(question, gold, _distribution(question, answers[
                    question.name])))
            if on_record is not None:
                on_record(i + 1)
        return samples
    finally:
        engine.calibration = saved


def _distribution(question: Any, answer: dict[str, Any]) -> tuple[float, ...]:
    if answer["type"] == "noul":
        return (float(answer["noul"]), 1.0 - float(answer["noul"]))
    if answer["type"] == "choice":
        return tuple(float(answer["probabilities"][o]) for o in question.options)
    return tuple(float(answer["probabilities"][str(i)]) for i in range(len(question.options)))


def content_free_bias(engine: Any, questions: Sequence[Any], *, debias: str | None = None
                      ) -> dict[str, dict[str, float]]:
    """Per question key: ``-log`` of the mean answer over content-free states, centred."""
    saved, engine.calibration = engine.calibration, None
    try:
        out: dict[str, dict[str, float]] = {}
        for q in questions:
            key = question_key(q)
            if key in out:
                continue
            body = {"type": q.type, "instructions": q.instructions}
            if q.type == "choice":
                body["criteria"] = dict(zip(q.options, q.descriptions))
            elif q.type == "score":
                body["criteria"] = list(q.descriptions)
            elif any(d is not None for d in q.descriptions):
                body["criteria"] = dict(zip(q.options, q.descriptions))
            mean = np.zeros(len(q.options))
            for state in CONTENT_FREE_STATES:
                answer = engine.answer({"state": state, "questions": {"q": body}},
                                       debias=debias)["answers"]["q"]
                mean += np.array(_distribution(q, answer))
            bias = -np.log(np.maximum(mean / len(CONTENT_FREE_STATES), 1e-12))
            bias -= bias.mean()
            out[key] = dict(zip(q.options, bias.tolist()))
        return out
    finally:
        engine.calibration = saved


def _fit(logs: list[np.ndarray], golds: list[int], *, fit_bias: bool, base_bias: np.ndarray,
         l2: float = 0.05, steps: int = 400) -> tuple[float, np.ndarray]:
    """(T, b) minimising mean NLL of softmax(log p / T + base_bias + b) + l2 |b|^2 (Adam)."""
    z = np.stack(logs)  # same question: same K
    y = np.zeros_like(z)
    y[np.arange(len(golds)), golds] = 1.0
    u, b = 0.0, np.zeros(z.shape[1])  # a = 1/T = exp(u)
    m = np.zeros(z.shape[1] + 1)
    v = np.zeros_like(m)
    lr = 0.05
    for t in range(1, steps + 1):
        a = math.exp(u)
        s = z * a + base_bias + b
        s -= s.max(axis=1, keepdims=True)
        q = np.exp(s)
        q /= q.sum(axis=1, keepdims=True)
        d = (q - y) / len(golds)
        grad = np.concatenate([[a * float((d * z).sum())],
                               d.sum(axis=0) + 2 * l2 * b if fit_bias else np.zeros_like(b)])
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        step = lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        u -= step[0]
        b -= step[1:]
    return 1.0 / math.exp(u), b


def _logs(sample: Sample) -> np.ndarray:
    return np.log(np.maximum(np.array(sample.probabilities), 1e-12))


def fit(samples: Sequence[Sample], method: str, identity: dict[str, Any], *,
        content_free: dict[str, dict[str, float]] | None = None, debias: str = "none"
        ) -> Calibration:
    """A :class:`Calibration` of ``method`` fitted on ``samples``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "fit" and content_free is None:
        raise ValueError(f"method {method!r} needs the content-free bias")
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(question_key(s.question), []).append(s)
    cal = Calibration(identity=dict(identity), method=method, debias=debias)
    for key, group in groups.items():
        q = group[0].question
        prior = np.array([(content_free or {}).get(key, {}).get(o, 0.0) for o in q.options])
        if method == "content-free":
            temperature, b = 1.0, prior
        else:
            base = prior if method == "both" else np.zeros(len(q.options))
            temperature, extra = _fit([_logs(s) for s in group], [s.gold for s in group],
                                      fit_bias=method == "fit", base_bias=base)
            b = base + extra
        cal.questions[key] = QuestionCorrection(q.name, q.type, float(temperature),
                                                dict(zip(q.options, b.tolist())))
    for kind in sorted({s.question.type for s in samples}):
        of_kind = [s for s in samples if s.question.type == kind]
        by_k: dict[int, list[Sample]] = {}
        for s in of_kind:
            by_k.setdefault(len(s.probabilities), []).append(s)
        # one temperature for the type: fitted on its most common option count
        common = max(by_k.values(), key=len)
        temperature, _ = _fit([_logs(s) for s in common], [s.gold for s in common],
                              fit_bias=False, base_bias=np.zeros(len(common[0].probabilities)))
        cal.type_temperature[kind] = float(temperature)
    return cal


def metrics(samples: Sequence[Sample], calibration: Calibration | None = None
            ) -> dict[str, float]:
    """Accuracy, NLL, Brier and ECE (10 bins) of ``samples``, corrected by ``calibration``."""
    from onepass.evaluate import brier_score, expected_calibration_error
    from onepass.readout import argmax_first

    probs = [calibration.apply(s.question, s.probabilities) if calibration else
             list(s.probabilities) for s in samples]
    ok = [argmax_first(p) == s.gold for p, s in zip(probs, samples)]
    n = max(1, len(samples))
    return {
        "n": len(samples),
        "accuracy": sum(ok) / n,
        "nll": -sum(math.log(max(p[s.gold], 1e-12)) for p, s in zip(probs, samples)) / n,
        "brier": sum(brier_score(p, s.gold) for p, s in zip(probs, samples)) / n,
        "ece": expected_calibration_error([max(p) for p in probs], ok),
    }


def split(samples: Sequence[Sample], fraction: float, seed: int
          ) -> tuple[list[Sample], list[Sample]]:
    """A seeded ``fraction`` / rest split."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    cut = int(round(len(order) * fraction))
    return [samples[i] for i in order[:cut]], [samples[i] for i in order[cut:]]


def choose(samples: Sequence[Sample], identity: dict[str, Any], *,
           content_free: dict[str, dict[str, float]], debias: str = "none", seed: int = 0
           ) -> tuple[str, dict[str, dict[str, float]]]:
    """The method with the lowest held-out NLL (fit on 70%, scored on 30%) and every
    method's held-out metrics (``none``: uncalibrated)."""
    train, held = split(samples, 0.7, seed)
    table = {"none": metrics(held)}
    for method in METHODS:
        table[method] = metrics(held, fit(train, method, identity, content_free=content_free,
                                          debias=debias))
    best = min(METHODS, key=lambda m: table[m]["nll"])  # METHODS is simplest first
    return best, table


def fit_abstention(samples: Sequence[Sample], calibration: Calibration | None,
                   target_error: float) -> tuple[float | None, list[dict[str, float]]]:
    """The lowest threshold on the top probability whose answered questions err at most
    ``target_error`` (None: no threshold reaches it), and the coverage/error curve."""
    from onepass.readout import argmax_first

    rows = []
    for s in samples:
        p = calibration.apply(s.question, s.probabilities) if calibration else s.probabilities
        rows.append((max(p), argmax_first(p) == s.gold))
    rows.sort(key=lambda r: -r[0])
    curve, best = [], None
    errors = 0
    for i, (conf, ok) in enumerate(rows, start=1):
        errors += not ok
        if i < len(rows) and rows[i][0] == conf:
            continue  # a threshold answers every tie at once
        error = errors / i
        curve.append({"threshold": conf, "coverage": i / len(rows), "error": error})
        if error <= target_error:
            best = conf
    return best, curve
