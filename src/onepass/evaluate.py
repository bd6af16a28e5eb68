"""Evaluate served decisions against gold answers: accuracy, Brier, calibration, confusion.

Answers come from :meth:`DecisionEngine.answer`, the same path the HTTP server runs, so the
numbers describe what clients get. Definitions (stated in every report):

* accuracy: the served answer (noul: P(yes) >= 0.5 means yes; choice: the chosen option;
  score: the most probable level) equals the gold answer;
* Brier score: multi-class, ``sum_k (p_k - y_k)^2`` per question, averaged (0 is perfect, 2 the
  worst; a noul's is twice the binary ``(p_yes - y)^2``);
* ECE: expected calibration error of the top-label probability over 10 equal-width bins on
  [0, 1]: ``sum_b n_b / N * |accuracy_b - confidence_b|``;
* score questions also get the mean absolute error of the served score (the expected level
  index) against the gold level index.

Questions with a single candidate (answered without the model) are counted but not scored.
The metric functions are pure; plotting needs matplotlib (``pip install 'onepass[plot]'``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onepass.readout import argmax_first

ECE_BINS = 10
ECE_NOTE = "ECE over 10 equal-width bins of the top-label probability"
BRIER_NOTE = "multi-class Brier score: sum over candidates of (p - y)^2, averaged"


# --------------------------------------------------------------------------- pure metrics


def brier_score(probabilities: Sequence[float], gold: int) -> float:
    """``sum_k (p_k - [k == gold])^2`` for one question."""
    return sum((p - (1.0 if k == gold else 0.0)) ** 2 for k, p in enumerate(probabilities))


def calibration_bins(
    confidences: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS
) -> list[dict[str, float]]:
    """Equal-width bins over [0, 1]: count, mean confidence and accuracy per bin."""
    counts = [0] * bins
    conf_sum = [0.0] * bins
    hits = [0] * bins
    for c, ok in zip(confidences, correct):
        b = min(int(c * bins), bins - 1) if c > 0 else 0
        counts[b] += 1
        conf_sum[b] += c
        hits[b] += bool(ok)
    return [
        {
            "lower": b / bins,
            "upper": (b + 1) / bins,
            "count": counts[b],
            "confidence": conf_sum[b] / counts[b] if counts[b] else 0.0,
            "accuracy": hits[b] / counts[b] if counts[b] else 0.0,
        }
        for b in range(bins)
    ]


def expected_calibration_error(
    confidences: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS
) -> float:
    """``sum_b n_b / N * |accuracy_b - confidence_b|`` over equal-width bins."""
    n = len(confidences)
    if n == 0:
        return 0.0
    return sum(
        b["count"] / n * abs(b["accuracy"] - b["confidence"])
        for b in calibration_bins(confidences, correct, bins)
    )


@dataclass(frozen=True)
class Prediction:
    """One question's served distribution next to its gold answer."""

    source: str
    question: str
    type: str
    options: tuple[str, ...]
    gold: int
    probabilities: tuple[float, ...]
    predicted: int
    score: float | None = None  # score questions: the served expected level

    @property
    def correct(self) -> bool:
        return self.predicted == self.gold

    @property
    def confidence(self) -> float:
        return max(self.probabilities)


def prediction_from_answer(question: Any, gold: int, answer: dict[str, Any], source: str
                           ) -> Prediction:
    """Read a served answer (the System One response shape) into a :class:`Prediction`."""
    if answer["type"] == "noul":
        probs = (answer["noul"], 1.0 - answer["noul"])
        predicted = argmax_first(probs)
        score = None
    elif answer["type"] == "choice":
        probs = tuple(answer["probabilities"][o] for o in question.options)
        predicted = question.options.index(answer["choice"])
        score = None
    else:
        probs = tuple(answer["probabilities"][str(i)] for i in range(len(question.options)))
        predicted = argmax_first(probs)
        score = float(answer["score"])
    return Prediction(source, question.name, question.type, tuple(question.options), gold,
                      tuple(float(p) for p in probs), predicted, score)


def summarize(predictions: Sequence[Prediction]) -> dict[str, Any]:
    """accuracy, brier, ece (+ bins), and per-type extras for a group of predictions."""
    n = len(predictions)
    if n == 0:
        return {"n": 0, "accuracy": None, "brier": None, "ece": None}
    conf = [p.confidence for p in predictions]
    ok = [p.correct for p in predictions]
    out: dict[str, Any] = {
        "n": n,
        "accuracy": sum(ok) / n,
        "brier": sum(brier_score(p.probabilities, p.gold) for p in predictions) / n,
        "ece": expected_calibration_error(conf, ok),
        "mean_confidence": sum(conf) / n,
        "calibration_bins": calibration_bins(conf, ok),
    }
    kinds = {p.type for p in predictions}
    if len(kinds) == 1:
        kind = kinds.pop()
        out["type"] = kind
        labels: list[str] = []
        for p in predictions:
            for o in p.options:
                if o not in labels:
                    labels.append(o)
        if kind == "noul":
            labels = list(predictions[0].options)
        index = {o: i for i, o in enumerate(labels)}
        matrix = [[0] * len(labels) for _ in labels]
        for p in predictions:
            matrix[index[p.options[p.gold]]][index[p.options[p.predicted]]] += 1
        out["confusion"] = {"labels": labels, "rows": "gold", "columns": "predicted",
                            "matrix": matrix}
        if kind == "score":
            out["mae"] = sum(abs((p.score or 0.0) - p.gold) for p in predictions) / n
    return out


def answer_distribution(answer: dict[str, Any]) -> tuple[float, ...]:
    """A served answer's distribution in a fixed order (noul: yes, no; else the options')."""
    if answer["type"] == "noul":
        return (float(answer["noul"]), 1.0 - float(answer["noul"]))
    return tuple(float(p) for p in answer["probabilities"].values())


def compare_answers(
    reference: Sequence[dict[str, Any]], candidate: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """How closely ``candidate`` responses follow ``reference`` ones (same requests), question
    by question: how often the most probable answer agrees, and the total-variation distance
    (half the L1 distance) between the two distributions."""
    agree, distances = 0, []
    for ref, cand in zip(reference, candidate, strict=True):
        for name, answer in ref["answers"].items():
            p, q = answer_distribution(answer), answer_distribution(cand["answers"][name])
            agree += argmax_first(p) == argmax_first(q)
            distances.append(0.5 * sum(abs(a - b) for a, b in zip(p, q, strict=True)))
    n = len(distances)
    return {"questions": n, "agreement": agree / n if n else None,
            "mean_tv": sum(distances) / n if n else None, "max_tv": max(distances, default=None)}


# --------------------------------------------------------------------------- running

LOW_LABEL_MASS = 0.5
"""A dataset whose median answer put less of the model's probability than this on the option
labels is read mostly from tokens the model did not mean to say: ``onepass eval`` warns."""


LABEL_HEALTH_RECORDS = 50
"""Records of a run whose answers carry label health: reading it projects each answer onto the
whole vocabulary (~0.1 s a question for SmolLM2's 49k rows here, about what the answer itself
costs), and the median of 50 is enough to say whether a dataset reads noise."""


def diagnosed(engine: Any, request: Any, index: int) -> Any:
    """``request`` (the run's ``index``-th) asking for each answer's label health, for the
    first :data:`LABEL_HEALTH_RECORDS` records and where ``engine``'s backend reads the full
    vocabulary (the answers' probabilities are the same either way)."""
    if index < LABEL_HEALTH_RECORDS and getattr(getattr(engine, "capabilities", None),
                                                "vocab_statistics", False):
        return dataclasses.replace(request, diagnostics=True)
    return request


def label_health(diagnostics: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How much the model meant the labels over a run's answers (each answer's
    ``diagnostics``): the median and lowest label mass, the share of answers whose unrestricted
    argmax was a label, and whether the median is below :data:`LOW_LABEL_MASS` (over the first
    :data:`LABEL_HEALTH_RECORDS` records' answers). None when the backend reads no vocabulary
    statistics."""
    if not diagnostics:
        return None
    masses = [float(d["label_mass"]) for d in diagnostics]
    median = statistics.median(masses)
    return {"answers": len(masses), "median_label_mass": median, "min_label_mass": min(masses),
            "argmax_is_label": sum(bool(d["argmax_is_label"]) for d in diagnostics)
            / len(diagnostics), "low": median < LOW_LABEL_MASS}


def evaluate(
    engine: Any,
    records: Sequence[Any],
    *,
    on_record: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Answer every record with ``engine`` and score the answers (report dict, JSON-ready).

    ``records`` are :class:`onepass.train.dataset.Record` objects (validated, gold indices).
    """
    from onepass.prompt import PROMPT_VERSION

    predictions: list[Prediction] = []
    health: list[dict[str, Any]] = []
    trivial = 0
    tokens = 0
    start = time.perf_counter()
    for i, record in enumerate(records):
        response = engine.answer(diagnosed(engine, record.request, i))
        tokens += response["usage"]["input_tokens"]
        for question, gold in zip(record.request.questions, record.answers):
            if question.is_trivial:
                trivial += 1
                continue
            answer = response["answers"][question.name]
            if "diagnostics" in answer:
                health.append(answer["diagnostics"])
            predictions.append(prediction_from_answer(question, gold, answer, record.source))
        if on_record is not None:
            on_record(i + 1)
    seconds = time.perf_counter() - start
    overall = summarize(predictions)
    names: list[str] = []
    for p in predictions:
        if p.question not in names:
            names.append(p.question)
    per_question = {
        name: summarize([p for p in predictions if p.question == name]) for name in names
    }
    return {
        "accuracy": overall["accuracy"],
        "brier": overall["brier"],
        "ece": overall["ece"],
        "ece_bins": ECE_BINS,
        "notes": [ECE_NOTE, BRIER_NOTE],
        "questions": len(predictions),
        "trivial_questions": trivial,
        "records": len(records),
        "mean_confidence": overall.get("mean_confidence"),
        "calibration_bins": overall.get("calibration_bins"),
        "per_question": per_question,
        "throughput": {
            "seconds": round(seconds, 3),
            "records_per_second": len(records) / seconds if seconds else None,
            "questions_per_second": len(predictions) / seconds if seconds else None,
            "input_tokens_per_second": tokens / seconds if seconds else None,
            "input_tokens": tokens,
        },
        "label_health": label_health(health),
        "model": getattr(engine, "served_name", None),
        "prompt_version": PROMPT_VERSION,
        "predictions": [
            {"source": p.source, "question": p.question, "gold": p.options[p.gold],
             "predicted": p.options[p.predicted],
             "probabilities": dict(zip(p.options, p.probabilities)),
             **({"score": p.score} if p.score is not None else {})}
            for p in predictions
        ],
    }


# --------------------------------------------------------------------------- outputs


def reliability_diagram(
    series: dict[str, Sequence[dict[str, float]]], path: str | Path, title: str = ""
) -> Path:
    """A reliability diagram PNG: per-bin accuracy against confidence, plus bin counts."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "plots need matplotlib: pip install 'onepass[plot]' (or matplotlib)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect")
    width = 1.0 / max(1, len(series)) * 0.09
    for k, (name, bins) in enumerate(series.items()):
        used = [b for b in bins if b["count"]]
        top.plot([b["confidence"] for b in used], [b["accuracy"] for b in used],
                 marker="o", label=name)
        centres = [(b["lower"] + b["upper"]) / 2 + (k - (len(series) - 1) / 2) * width
                   for b in bins]
        bottom.bar(centres, [b["count"] for b in bins], width=width, label=name)
    top.set_ylabel("accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title(title or "reliability (10 equal-width bins)")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("top-label probability")
    bottom.set_ylabel("questions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_report(report: dict[str, Any], *, plot: str | None = None) -> str:
    """A short human-readable summary of a report."""
    lines = [
        "# onepass eval",
        "",
        f"- model: `{report.get('model')}`"
        + (f", adapter: `{report['adapter']}`" if report.get("adapter") else ""),
        f"- dataset: `{report.get('dataset', '-')}` — {report['records']} records, "
        f"{report['questions']} scored questions"
        + (f" ({report['trivial_questions']} single-candidate questions not scored)"
           if report.get("trivial_questions") else ""),
        f"- prompt: `{report.get('prompt_version')}`",
        "",
        "| | accuracy | Brier | ECE | n |",
        "|---|---|---|---|---|",
        f"| **overall** | {_fmt(report['accuracy'])} | {_fmt(report['brier'])} | "
        f"{_fmt(report['ece'])} | {report['questions']} |",
    ]
    for name, q in report["per_question"].items():
        extra = f" (MAE {_fmt(q['mae'])})" if "mae" in q else ""
        lines.append(f"| {name} ({q.get('type', 'mixed')}){extra} | {_fmt(q['accuracy'])} | "
                     f"{_fmt(q['brier'])} | {_fmt(q['ece'])} | {q['n']} |")
    t = report["throughput"]
    lines += [
        "",
        f"{ECE_NOTE}; {BRIER_NOTE}.",
        "",
        f"Throughput: {_fmt(t['questions_per_second'], 2)} questions/s, "
        f"{_fmt(t['input_tokens_per_second'], 0)} input tokens/s ({t['seconds']} s).",
    ]
    for name, q in report["per_question"].items():
        confusion = q.get("confusion")
        if not confusion or len(confusion["labels"]) > 12:
            continue
        labels = confusion["labels"]
        lines += ["", f"Confusion for `{name}` (rows: gold, columns: predicted):", "",
                  "| gold \\ predicted | " + " | ".join(labels) + " |",
                  "|---" * (len(labels) + 1) + "|"]
        for label, row in zip(labels, confusion["matrix"]):
            lines.append(f"| {label} | " + " | ".join(str(v) for v in row) + " |")
    if plot:
        lines += ["", f"![reliability diagram]({plot})"]
    return "\n".join(lines) + "\n"
