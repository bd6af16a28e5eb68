import math

import pytest

from onepass.readout import (
    argmax_first,
    choice_confidence,
    expected_level,
    restricted_softmax,
    score_confidence,
)


def test_softmax_sums_to_one_and_orders():
    p = restricted_softmax([2.0, 1.0, 0.0])
    assert sum(p) == pytest.approx(1.0)
    assert p[0] > p[1] > p[2]
    assert p[0] == pytest.approx(math.exp(2) / (math.exp(2) + math.exp(1) + 1))


def test_softmax_is_shift_invariant_and_stable_for_large_logits():
    assert restricted_softmax([1000.0, 999.0]) == pytest.approx(restricted_softmax([1.0, 0.0]))


def test_temperature_sharpens_and_flattens():
    base = restricted_softmax([1.0, 0.0])
    cold = restricted_softmax([1.0, 0.0], temperature=0.5)
    hot = restricted_softmax([1.0, 0.0], temperature=4.0)
    assert cold[0] > base[0] > hot[0] > 0.5
    assert cold[0] == pytest.approx(restricted_softmax([2.0, 0.0])[0])


@pytest.mark.parametrize("t", [1e-320, 1e-300, 1e300])
def test_extreme_client_temperatures_give_a_distribution_not_nan(t):
    """A client may send any finite temperature > 0: 1e-320 once overflowed logits to inf
    (inf - inf = NaN, a 500); it must be the argmax's one-hot (or uniform, for 1e300)."""
    p = restricted_softmax([12.0, 3.0, 12.0], temperature=t)
    assert all(math.isfinite(x) for x in p) and sum(p) == pytest.approx(1.0)
    assert p == ([0.5, 0.0, 0.5] if t < 1 else pytest.approx([1 / 3] * 3))


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_rejected(t):
    with pytest.raises(ValueError):
        restricted_softmax([1.0, 0.0], temperature=t)


def test_argmax_first_wins_ties():
    assert argmax_first([0.25, 0.5, 0.25]) == 1
    assert argmax_first([0.4, 0.4, 0.2]) == 0
    assert argmax_first([0.2, 0.4, 0.4]) == 1


def test_choice_confidence_published_formula():
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert choice_confidence([1.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert choice_confidence([0.9, 0.05, 0.05]) == pytest.approx((0.9 - 1 / 3) / (2 / 3))
    assert choice_confidence([0.95, 0.03, 0.02]) == pytest.approx(0.925)
    assert choice_confidence([1.0]) == 1.0
    assert choice_confidence([0.0, 0.0]) == 0.0  # zero total falls back to uniform


def test_score_value_is_expected_index():
    assert expected_level([0.2, 0.4, 0.4]) == pytest.approx(1.2)
    assert expected_level([0.0, 0.0, 1.0]) == pytest.approx(2.0)


def test_score_confidence_published_example():
    # the documented example: [0.0, 0.95, 0.05] -> 0.92 (rounded)
    assert score_confidence([0.0, 0.95, 0.05]) == pytest.approx(0.925)
    assert score_confidence([1 / 4] * 4) == pytest.approx(0.0)
    assert score_confidence([0, 0, 1.0, 0]) == pytest.approx(1.0)
    assert score_confidence([1.0]) == 1.0
    # bimodal mass far from the mode is less confident than mass next to it
    assert score_confidence([0.5, 0.0, 0.0, 0.5]) < score_confidence([0.5, 0.5, 0.0, 0.0])
    assert score_confidence([0.5, 0.0, 0.0, 0.5]) == 0.0  # clipped at zero
