"""Calibration: make the served probabilities mean what they say. No torch.

A small model's restricted softmax is biased (it favours some options whatever the state) and
mis-scaled (over- or under-confident). ``onepass calibrate`` fits, from labelled Jev-native
records, a correction applied to every answer's distribution in declared order::

    p'_k ∝ exp(log p_k / T + b_k)

* ``content-free``: ``b_k = -log p̄_k`` where ``p̄`` is the model's mean answer for the same
  question about content-free states (``N/A``, ``[MASK]``, …); no labels needed, ``T = 1``;
* ``fit``: ``T`` and ``b`` minimise the held-in negative log-likelihood (``b`` L2-regularised);
* ``both``: the content-free ``b``, then ``T`` fitted;
* ``matrix``: ``p'_k ∝ exp(Σ_j W_kj log p_j + b_k)`` with a full ``W`` (matrix scaling, Guo et
  al. 2017): a multinomial logistic regression on the standardised log-probabilities,
  L2-regularised. A small model can answer "A" to everything yet move its mass with the state;
  a temperature and a bias cannot read that, a matrix can. It has ``K² + K`` parameters per
  question, so it wants more labelled records than the others;
* ``auto`` (the default): each method fitted on a seeded 70% and the one with the lowest
  negative log-likelihood on the other 30% kept (ties: the simplest).

``b``, ``T`` and ``W`` are per question (its type, instructions and options); questions the file has
not seen get the per-type temperature. The file records the model, dtype, adapter and prompt
version it was fitted for; :meth:`Calibration.check` refuses any other. It can also carry an
abstention threshold fitted for a target error rate (:func:`fit_abstention`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "onepass-calibration-1"
METHODS = ("content-free", "fit", "both", "matrix")  # simplest first
MATRIX_L2 = 0.01  # on the standardised W: measured on CLINC150 (docs/quality.md)
CONTENT_FREE_STATES = ("N/A", "[MASK]", "-", "nothing")
IDENTITY_KEYS = ("model", "dtype", "adapter", "prompt_version")
LOG_FLOOR = 1e-12  # probabilities are floored here before a log, in fitting and in use
# a trained adapter's own calibration, beside its weights (written by the trainer)
BUNDLED = "calibration.json"


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
    """``T`` and per-option ``b`` (by option name) for one question; ``matrix`` (method
    ``matrix``): ``W`` by output option, then input option, applied to ``log p`` instead of
    ``1/T``."""

    name: str
    type: str
    temperature: float
    bias: dict[str, float]
    matrix: dict[str, dict[str, float]] | None = None


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
            if fit.matrix is not None:
                w = np.array([[fit.matrix[o][j] for j in question.options]
                              for o in question.options])
                return _softmax(w @ _floored_log(probabilities) + np.array(bias)).tolist()
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
    def bundled(cls, directory: str | Path, identity: dict[str, Any]) -> Calibration | None:
        """The calibration a trained adapter carries in ``directory`` (None: it has none, or
        one fitted for another prompt version, with a warning), adopted for ``identity``: it
        was fitted on that adapter's own validation answers, so only the prompt version must
        match (a temperature does not depend on where the directory lies or on the float dtype
        it is served in)."""
        path = Path(directory) / BUNDLED
        if not path.is_file():
            return None
        try:
            calibration = cls.load(path)
        except CalibrationError as exc:  # e.g. a hub checkpoint's own file of that name
            warnings.warn(f"{exc}: not applied", stacklevel=2)
            return None
        if calibration.identity.get("prompt_version") != identity.get("prompt_version"):
            warnings.warn(
                f"{path} was fitted for prompt version "
                f"{calibration.identity.get('prompt_version')!r}, served "
                f"{identity.get('prompt_version')!r}: not applied (retrain the adapter)",
                stacklevel=2)
            return None
        calibration.identity = dict(identity)
        return calibration

    @staticmethod
    def carry_bundled(source: str | Path | None, target: str | Path) -> bool:
        """Copy ``source``'s own calibration into ``target``, a checkpoint made from it
        (``onepass merge``, ``onepass quantize``), so the new directory answers as the
        adapter or trained checkpoint did; whether there was one."""
        path = Path(source) / BUNDLED if source is not None else None
        if path is None or not path.is_file():
            return False
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(target) / BUNDLED)
        return True

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
    diagnostics: dict[str, Any] | None = None  # the answer's label health, where read
    debias: str = "none"  # the mode it was read in: a calibration applies to that mode only


def collect(engine: Any, records: Sequence[Any], *, debias: str | None = None,
            on_record: Callable[[int], None] | None = None) -> list[Sample]:
    """Answer every record with ``engine`` (calibration off) and keep the distributions (and
    the first records' label health where the backend reads it)."""
    from onepass.evaluate import diagnosed

    saved, engine.calibration = engine.calibration, None
    try:
        samples = []
        for i, record in enumerate(records):
            answers = engine.answer(diagnosed(engine, record.request, i),
                                    debias=debias)["answers"]
            mode = debias or record.request.debias or engine.debias  # as the engine resolves it
            for question, gold in zip(record.request.questions, record.answers):
                if question.is_trivial:
                    continue
                answer = answers[question.name]
                samples.append(Sample(question, gold, _distribution(question, answer),
                                      answer.get("diagnostics"), mode))
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
            bias = -_floored_log(mean / len(CONTENT_FREE_STATES))
            bias -= bias.mean()
            out[key] = dict(zip(q.options, bias.tolist()))
        return out
    finally:
        engine.calibration = saved


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _adam(params: np.ndarray, gradient: Callable[[np.ndarray], np.ndarray], steps: int,
          lr: float = 0.05) -> np.ndarray:
    """``params`` after ``steps`` Adam steps down ``gradient`` (convex fits: no schedule)."""
    m = np.zeros_like(params)
    v = np.zeros_like(params)
    for t in range(1, steps + 1):
        g = gradient(params)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g**2
        params = params - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return params


def _fit(z: np.ndarray, golds: np.ndarray, *, fit_bias: bool, base_bias: np.ndarray,
         l2: float = 0.05, steps: int = 400) -> tuple[float, np.ndarray]:
    """(T, b) minimising mean NLL of softmax(log p / T + base_bias + b) + l2 |b|^2."""
    y = np.eye(z.shape[1])[golds]

    def gradient(params: np.ndarray) -> np.ndarray:  # params: u = log(1/T), then b
        a, b = math.exp(params[0]), params[1:]
        d = (_softmax(z * a + base_bias + b) - y) / len(golds)
        grad_b = d.sum(axis=0) + 2 * l2 * b if fit_bias else np.zeros_like(b)
        return np.concatenate([[a * float((d * z).sum())], grad_b])

    params = _adam(np.zeros(z.shape[1] + 1), gradient, steps)
    return 1.0 / math.exp(params[0]), params[1:]


def _fit_matrix(z: np.ndarray, golds: np.ndarray, *, l2: float = MATRIX_L2, steps: int = 2000
                ) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) of softmax(W log p + b): logistic regression on the standardised log-probs (L2
    on W), the standardisation folded back into W and b."""
    k = z.shape[1]
    mean, std = z.mean(axis=0), z.std(axis=0)
    scale = np.where(std > 1e-9, 1.0 / np.maximum(std, 1e-9), 0.0)  # a constant option: unread
    x = (z - mean) * scale
    y = np.eye(k)[golds]

    def gradient(params: np.ndarray) -> np.ndarray:
        w, b = params[: k * k].reshape(k, k), params[k * k:]
        d = (_softmax(x @ w.T + b) - y) / len(golds)
        return np.concatenate([(d.T @ x + 2 * l2 * w).ravel(), d.sum(axis=0)])

    params = _adam(np.zeros(k * k + k), gradient, steps)
    w = params[: k * k].reshape(k, k) * scale
    return w, params[k * k:] - w @ mean


def _floored_log(probabilities: Any) -> np.ndarray:
    """``log p`` with ``p`` floored at ``LOG_FLOOR``: the same features in fitting and in use."""
    return np.log(np.maximum(np.asarray(probabilities, dtype=float), LOG_FLOOR))


def _aligned(group: Sequence[Sample], options: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The group's log-probabilities and gold indices in ``options`` order (one question key
    can arrive with its options in any order)."""
    rows, golds = [], []
    for s in group:
        where = {o: i for i, o in enumerate(s.question.options)}
        rows.append([s.probabilities[where[o]] for o in options])
        golds.append(options.index(s.question.options[s.gold]))
    return _floored_log(rows), np.array(golds)


def fit(samples: Sequence[Sample], method: str, identity: dict[str, Any], *,
        content_free: dict[str, dict[str, float]] | None = None, debias: str | None = None
        ) -> Calibration:
    """A :class:`Calibration` of ``method`` fitted on ``samples``, for the debias mode they
    were read in (``debias`` names it where the samples did not come from :func:`collect`)."""
    if debias is None:
        modes = {s.debias for s in samples}
        if len(modes) > 1:
            raise ValueError(f"samples read in several debias modes: {sorted(modes)}")
        debias = modes.pop() if modes else "none"
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method in ("content-free", "both") and content_free is None:
        raise ValueError(f"method {method!r} needs the content-free bias")
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(question_key(s.question), []).append(s)
    cal = Calibration(identity=dict(identity), method=method, debias=debias)
    for key, group in groups.items():
        q = group[0].question
        prior = np.array([(content_free or {}).get(key, {}).get(o, 0.0) for o in q.options])
        z, golds = _aligned(group, q.options)
        matrix = None
        if method == "content-free":
            temperature, b = 1.0, prior
        elif method == "matrix":
            w, b = _fit_matrix(z, golds)
            temperature = 1.0
            matrix = {o: dict(zip(q.options, row)) for o, row in zip(q.options, w.tolist())}
        else:
            base = prior if method == "both" else np.zeros(len(q.options))
            temperature, extra = _fit(z, golds, fit_bias=method == "fit", base_bias=base)
            b = base + extra
        cal.questions[key] = QuestionCorrection(q.name, q.type, float(temperature),
                                                dict(zip(q.options, b.tolist())), matrix)
    for kind in sorted({s.question.type for s in samples}):
        of_kind = [s for s in samples if s.question.type == kind]
        by_k: dict[int, list[Sample]] = {}
        for s in of_kind:
            by_k.setdefault(len(s.probabilities), []).append(s)
        # one temperature for the type: fitted on its most common option count
        common = max(by_k.values(), key=len)
        temperature, _ = _fit(_floored_log([s.probabilities for s in common]),
                              np.array([s.gold for s in common]), fit_bias=False,
                              base_bias=np.zeros(len(common[0].probabilities)))
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


def _padded(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """Rows of any length as one matrix, padded with -inf (no probability)."""
    out = np.full((len(rows), max((len(r) for r in rows), default=0)), -np.inf)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _target_matrix(golds: Sequence[int] | Sequence[Sequence[float]], shape: tuple[int, int]
                   ) -> np.ndarray:
    """The golds as one target distribution per row: a gold index one-hot, a target
    distribution (distillation) as given, padded with 0."""
    out = np.zeros(shape)
    for i, gold in enumerate(golds):
        if isinstance(gold, (int, np.integer)):
            out[i, gold] = 1.0
        else:
            out[i, : len(gold)] = gold
    return out


def temperature_nll(log_probs: Sequence[Sequence[float]] | np.ndarray,
                    golds: Sequence[int] | Sequence[Sequence[float]] | np.ndarray,
                    temperature: float) -> float:
    """Mean negative log-likelihood of the golds under ``softmax(log p / T)``, each row over
    its own options (rows may differ in length); a gold is an option index or a target
    distribution over the row's options (the cross-entropy against it). Either may come
    prepared: ``log_probs`` padded (:func:`_padded`), ``golds`` as :func:`_target_matrix`."""
    z = log_probs if isinstance(log_probs, np.ndarray) else _padded(log_probs)
    if not len(z):
        return 0.0
    scaled = z / temperature
    top = scaled.max(axis=1)
    lse = top + np.log(np.exp(scaled - top[:, None]).sum(axis=1))
    targets = golds if isinstance(golds, np.ndarray) and golds.ndim == 2 else \
        _target_matrix(golds, z.shape)
    return float((lse - (targets * np.where(np.isfinite(scaled), scaled, 0.0)).sum(axis=1))
                 .mean())


def fit_temperature(log_probs: Sequence[Sequence[float]],
                    golds: Sequence[int] | Sequence[Sequence[float]]) -> float:
    """The ``T`` in ``[1/e^4, e^4]`` minimising :func:`temperature_nll` over finite logits or
    log-probabilities (rows of any length): temperature scaling (Guo et al. 2017). One
    parameter, so a few dozen held-out questions fit it, and it never changes which option is
    on top. The NLL is convex in ``1/T``: a golden-section search on ``log(1/T)`` finds it."""
    if not len(golds):
        return 1.0
    z = _padded(log_probs)
    targets = _target_matrix(golds, z.shape)  # once: the search evaluates ~60 temperatures
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = -4.0, 4.0

    def nll(u: float) -> float:
        return temperature_nll(z, targets, math.exp(-u))

    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(b)
    return math.exp(-(lo + hi) / 2)


def split(samples: Sequence[Sample], fraction: float, seed: int
          ) -> tuple[list[Sample], list[Sample]]:
    """A seeded ``fraction`` / rest split."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    cut = int(round(len(order) * fraction))
    return [samples[i] for i in order[:cut]], [samples[i] for i in order[cut:]]


def choose(samples: Sequence[Sample], identity: dict[str, Any], *,
           content_free: dict[str, dict[str, float]], debias: str | None = None, seed: int = 0
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
