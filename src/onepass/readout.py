"""Readout: from candidate-label logits to typed answers. Pure math, no torch.

The model's logits are read for the candidate labels only; a softmax restricted to those
labels (with a temperature) gives the distribution every answer is built from. The confidence
formulas are the published ones (TypeSafe's system-one-adapter 0.2.1), so clients that
threshold on confidence behave as they do against hosted Jev.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def restricted_softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Softmax over the candidate logits only, at ``temperature`` (> 0)."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ValueError("temperature must be a finite number greater than 0")
    if not logits:
        return []
    top = max(logits)
    # shift before scaling: a tiny temperature sends every gap to -inf (exp 0), never inf - inf
    exps = [math.exp((x - top) / temperature) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def argmax_first(probabilities: Sequence[float]) -> int:
    """Index of the largest probability; the first one wins ties (declared order)."""
    best = 0
    for i, p in enumerate(probabilities):
        if p > probabilities[best]:
            best = i
    return best


def choice_confidence(probabilities: Sequence[float]) -> float:
    """``(p_max - 1/K) / (1 - 1/K)``; 1.0 for a single option."""
    k = len(probabilities)
    if k <= 1:
        return 1.0
    total = sum(probabilities)
    probs = [p / total for p in probabilities] if total > 0 else [1.0 / k] * k
    return max(0.0, (max(probs) - 1.0 / k) / (1.0 - 1.0 / k))


def expected_level(probabilities: Sequence[float]) -> float:
    """Score value: ``sum(i * p_i)`` over probabilities rescaled to sum to 1."""
    total = sum(probabilities)
    if total <= 0:
        return (len(probabilities) - 1) / 2
    return sum(i * p for i, p in enumerate(probabilities)) / total


def score_confidence(probabilities: Sequence[float]) -> float:
    """``max(0, 1 - E|i - mode| / MAD_uniform)``; 1.0 for a single level.

    MAD_uniform is the mean distance under a uniform distribution, ``mean_i |i - (n-1)/2|``,
    as in the published definition.
    """
    n = len(probabilities)
    if n <= 1:
        return 1.0
    total = sum(probabilities)
    probs = [p / total for p in probabilities] if total > 0 else [1.0 / n] * n
    mode = argmax_first(probs)
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    centre = (n - 1) / 2
    uniform_spread = sum(abs(i - centre) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform_spread)


COMBINE_RULES = ("mean", "logmean")


def combine_rotations(
    distributions: Sequence[Sequence[float]], how: str = "mean"
) -> list[float]:
    """One distribution from several readings of the same options (already in declared order).

    ``mean`` averages the probabilities (a mixture: one confident reading cannot veto the
    others); ``logmean`` averages log-probabilities and renormalises (a geometric mean: an
    option must be likely in every reading). ``onepass bench`` reports both.
    """
    if how not in COMBINE_RULES:
        raise ValueError(f"combine rule must be one of {COMBINE_RULES}, got {how!r}")
    if not distributions:
        return []
    n = len(distributions)
    if how == "mean":
        return [sum(col) / n for col in zip(*distributions, strict=True)]
    tiny = 1e-300  # log(0) guard: a reading that rules an option out drives it to ~0
    logs = [
        sum(math.log(max(p, tiny)) for p in col) / n for col in zip(*distributions, strict=True)
    ]
    top = max(logs)
    exps = [math.exp(x - top) for x in logs]
    total = sum(exps)
    return [e / total for e in exps]


def top_probability(probabilities: Sequence[float]) -> float:
    """The top-label probability: what ECE bins and what abstention thresholds."""
    return max(probabilities) if probabilities else 1.0


def divide_prior(probabilities: Sequence[float], prior: Sequence[float]) -> list[float]:
    """``p_k / q_k`` renormalised: an answer with the model's content-free prior ``q`` taken
    out (contextual calibration, Zhao et al. 2021). Where the document moves nothing the
    result is uniform: the reading carried no evidence."""
    tiny = 1e-30
    ratios = [p / max(q, tiny) for p, q in zip(probabilities, prior, strict=True)]
    total = sum(ratios)
    n = len(ratios)
    return [x / total for x in ratios] if total > 0 else [1.0 / n] * n


def label_diagnostics(label_logits: Sequence[float], logsumexp: float,
                      max_logit: float) -> dict[str, float | bool]:
    """How much the model meant the labels at an answer position: ``label_mass``, the labels'
    total probability in the model's own (temperature 1) distribution over its whole
    vocabulary (``logsumexp`` its normaliser), and ``argmax_is_label``, whether its most likely
    token (``max_logit``) is a label. A low mass says the restricted softmax was choosing
    between tokens the model did not mean to say."""
    mass = sum(math.exp(x - logsumexp) for x in label_logits)
    return {"label_mass": min(1.0, mass),
            "argmax_is_label": bool(label_logits) and max(label_logits) >= max_logit}
