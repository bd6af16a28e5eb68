"""Calibration files: round trip, refusal on mismatch, and a lower held-out ECE on real data."""

from __future__ import annotations

import json

import pytest

from onepass.calibration import (
    Calibration,
    CalibrationError,
    QuestionCorrection,
    Sample,
    collect,
    content_free_bias,
    fit,
    fit_abstention,
    metrics,
    question_key,
)
from onepass.contract import parse_request
from onepass.datasets import clinc150_domain_routing
from onepass.train.dataset import parse_record

IDENTITY = {"model": "smollm2-135m-instruct", "dtype": "float32", "adapter": None,
            "prompt_version": "onepass-prompt-1"}


def _question(order=("a", "b", "c")):
    criteria = {k: f"option {k}" for k in order}
    return parse_request({"state": "x", "questions": {"q": {
        "type": "choice", "instructions": "Pick one", "criteria": criteria}}}).questions[0]


def test_question_key_ignores_option_order_but_not_content():
    assert question_key(_question()) == question_key(_question(("c", "a", "b")))
    assert question_key(_question()) != question_key(_question(("a", "b", "d")))


def test_round_trip_and_apply(tmp_path):
    q = _question()
    cal = Calibration(IDENTITY, "fit", debias="rotations",
                      questions={question_key(q): QuestionCorrection(
                          "q", "choice", 2.0, {"a": 0.5, "b": 0.0, "c": -0.5})},
                      type_temperature={"choice": 1.5}, abstain_below=0.4,
                      report={"note": "x"})
    path = cal.save(tmp_path / "calibration.json")
    back = Calibration.load(path)
    assert back.to_json() == cal.to_json()
    assert json.loads(path.read_text())["prompt_version"] == "onepass-prompt-1"
    p = back.apply(q, [0.2, 0.3, 0.5])
    assert sum(p) == pytest.approx(1.0)
    # log p / 2 + b, softmax: worked by hand
    import math
    z = [math.log(0.2) / 2 + 0.5, math.log(0.3) / 2, math.log(0.5) / 2 - 0.5]
    expected = [math.exp(x) / sum(math.exp(y) for y in z) for x in z]
    assert p == pytest.approx(expected)
    # a question the file has not seen: the type's temperature only
    other = _question(("x", "y"))
    assert back.apply(other, [0.8, 0.2])[0] == pytest.approx(
        0.8 ** (1 / 1.5) / (0.8 ** (1 / 1.5) + 0.2 ** (1 / 1.5)))


def test_mismatch_is_refused(tmp_path):
    cal = Calibration(dict(IDENTITY, prompt_version="onepass-prompt-0"), "fit")
    with pytest.raises(CalibrationError, match="prompt_version: file 'onepass-prompt-0'"):
        cal.check(IDENTITY)
    cal.check(dict(cal.identity))  # its own identity passes
    (tmp_path / "bad.json").write_text('{"format": "something-else"}')
    with pytest.raises(CalibrationError, match="not a calibration file"):
        Calibration.load(tmp_path / "bad.json")


def test_engine_refuses_another_models_file(engine, tmp_path):
    path = Calibration(dict(engine.identity(), model="another-model"), "fit").save(
        tmp_path / "c.json")
    with pytest.raises(CalibrationError, match="model: file 'another-model'"):
        engine.set_calibration(path)
    assert engine.calibration is None


def test_abstention_threshold_meets_the_target():
    q = _question(("a", "b"))
    samples = [Sample(q, 0, (c, 1 - c)) for c in (0.95, 0.9, 0.85, 0.8)]
    samples += [Sample(q, 1, (c, 1 - c)) for c in (0.75, 0.7, 0.6)]
    threshold, curve = fit_abstention(samples, None, 0.2)
    assert threshold == 0.75  # answering down to 0.75: 1 error in 5
    assert curve[-1]["coverage"] == 1.0 and curve[-1]["error"] == pytest.approx(3 / 7)


def _records(data_dir, split, limit, seed):
    raws = clinc150_domain_routing(data_dir, split, limit=limit, seed=seed, describe=False)
    return [parse_record(raw, f"clinc-{split}", i) for i, raw in enumerate(raws, start=1)]


@pytest.mark.proof
def test_calibrated_ece_is_lower_on_held_out_clinc150(engine, data_dir):
    """Fit on CLINC150 validation records, score on test records (different utterances)."""
    train = collect(engine, _records(data_dir, "val", 40, seed=0))
    held = collect(engine, _records(data_dir, "test", 40, seed=0))
    prior = content_free_bias(engine, [train[0].question])
    before = metrics(held)
    for method in ("content-free", "fit", "both"):  # matrix wants more records than 40
        after = metrics(held, fit(train, method, engine.identity(), content_free=prior))
        assert after["ece"] < before["ece"], (method, before, after)
        assert after["nll"] < before["nll"], (method, before, after)
    # the engine applies a fitted file to served answers
    cal = fit(train, "fit", engine.identity(), content_free=prior)
    record = _records(data_dir, "test", 1, seed=5)[0]
    raw = engine.answer(record.request)["answers"]["domain"]["probabilities"]
    engine.set_calibration(cal)
    try:
        served = engine.answer(record.request)["answers"]["domain"]["probabilities"]
    finally:
        engine.set_calibration(None)
    q = record.request.questions[0]
    assert list(served.values()) == pytest.approx(cal.apply(q, [raw[o] for o in q.options]))


def test_abstained_answers_are_marked_and_the_official_client_tolerates_them(engine):
    ts = pytest.importorskip("typesafe_sdk")
    httpx2 = pytest.importorskip("httpx2")  # the SDK's own HTTP client

    request = {"state": "my card was declined at the shop", "questions": {
        "kind": {"type": "choice", "instructions": "What is it about?",
                 "criteria": {"cards": None, "loans": None, "travel": None}},
        "urgent": {"type": "noul", "instructions": "It is urgent."},
        "level": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "angry"]}}}
    assert all("abstained" not in a for a in engine.answer(request)["answers"].values())
    engine.set_abstain_below(0.999)
    try:
        body = engine.answer(request)
    finally:
        engine.set_abstain_below(None)
    assert {a["abstained"] for a in body["answers"].values()} == {True}
    response = ts.SystemOneResponse._decode(httpx2.Response(
        200, json=body, headers={"x-typesafe-request-id": "req_" + "0" * 32}))
    assert response.answers["kind"].choice == body["answers"]["kind"]["choice"]
    assert response.answers["urgent"].noul == body["answers"]["urgent"]["noul"]
    with pytest.raises(ValueError):
        engine.set_abstain_below(1.5)


def _crossed_samples(n, seed):
    """A model that always answers "a" and shows the gold only in which of b and c it ranks
    second, crossed (gold b: c second; gold c: b second). Half arrive with the options reversed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    forward, backward = _question(("a", "b", "c")), _question(("c", "b", "a"))
    shapes = {0: (0.6, 0.2, 0.2), 1: (0.55, 0.12, 0.33), 2: (0.55, 0.33, 0.12)}
    samples = []
    for i in range(n):
        gold = i % 3
        p = np.array(shapes[gold]) * np.exp(rng.normal(0, 0.08, 3))
        p = tuple((p / p.sum()).tolist())
        if i % 2:
            samples.append(Sample(backward, 2 - gold, p[::-1]))
        else:
            samples.append(Sample(forward, gold, p))
    return samples


def test_matrix_calibration_reads_what_a_temperature_and_bias_cannot():
    from onepass.calibration import choose

    train, held = _crossed_samples(150, seed=0), _crossed_samples(90, seed=1)
    assert metrics(held)["accuracy"] == pytest.approx(1 / 3, abs=0.05)  # always "a"
    matrix = metrics(held, fit(train, "matrix", IDENTITY))
    assert matrix["accuracy"] > 0.9, matrix
    assert metrics(held, fit(train, "fit", IDENTITY))["accuracy"] < 0.7
    best, table = choose(train, IDENTITY, content_free={}, seed=0)
    assert best == "matrix", table


def test_matrix_calibration_round_trips_and_follows_the_options_not_their_order(tmp_path):
    cal = fit(_crossed_samples(60, seed=0), "matrix", IDENTITY)
    back = Calibration.load(cal.save(tmp_path / "m.json"))
    assert back.to_json() == cal.to_json() and back.method == "matrix"
    p = back.apply(_question(("a", "b", "c")), [0.5, 0.15, 0.35])
    assert p[1] == max(p)  # c ranked second reads as gold b
    reversed_ = back.apply(_question(("c", "b", "a")), [0.35, 0.15, 0.5])
    assert reversed_ == pytest.approx(p[::-1], abs=1e-12)


def test_fit_temperature_recovers_the_temperature_that_drew_the_labels():
    """Labels drawn from softmax(z / 2.5) over rows of 2 to 6 options: temperature scaling
    finds ~2.5 (the NLL's minimum), and the fitted T never lowers the held-in NLL."""
    import numpy as np

    from onepass.calibration import fit_temperature, temperature_nll

    rng = np.random.default_rng(0)
    rows, golds = [], []
    for _ in range(4000):
        z = rng.normal(0.0, 3.0, size=int(rng.integers(2, 7)))
        p = np.exp(z / 2.5 - (z / 2.5).max())
        rows.append(z.tolist())
        golds.append(int(rng.choice(len(z), p=p / p.sum())))
    fitted = fit_temperature(rows, golds)
    assert fitted == pytest.approx(2.5, rel=0.08)
    assert temperature_nll(rows, golds, fitted) < temperature_nll(rows, golds, 1.0)
    assert fit_temperature([], []) == 1.0
    # an already calibrated reading keeps T ~ 1
    assert fit_temperature([[x / 2.5 for x in r] for r in rows], golds) == pytest.approx(
        1.0, rel=0.08)
    # the target distributions themselves (distillation's golds) fix T exactly, one-hot
    # targets read as their indices
    targets = [(np.exp(np.array(r) / 2.5) / np.exp(np.array(r) / 2.5).sum()).tolist()
               for r in rows[:200]]
    assert fit_temperature(rows[:200], targets) == pytest.approx(2.5, rel=1e-4)
    one_hot = [[float(i == g) for i in range(len(r))] for r, g in zip(rows, golds)]
    assert temperature_nll(rows, one_hot, 1.7) == temperature_nll(rows, golds, 1.7)


def test_a_bundled_calibration_is_adopted_for_the_served_identity(tmp_path):
    """A trained adapter's calibration.json is applied whatever path or dtype serves it, and
    refused (with a warning, not an error) when fitted for another prompt version."""
    from onepass.prompt import PROMPT_VERSION

    fitted = Calibration(identity={**IDENTITY, "prompt_version": PROMPT_VERSION,
                                   "adapter": None}, method="temperature",
                         type_temperature={"choice": 2.0})
    fitted.save(tmp_path / "calibration.json")
    served = {**IDENTITY, "dtype": "bfloat16", "adapter": str(tmp_path),
              "prompt_version": PROMPT_VERSION}
    adopted = Calibration.bundled(tmp_path, served)
    assert adopted is not None and adopted.identity == served
    adopted.check(served)
    assert adopted.apply(_question(), [0.64, 0.32, 0.04]) == pytest.approx([0.5110, 0.3613, 0.1277],
                                                                           abs=1e-4)
    assert Calibration.bundled(tmp_path / "none-here", served) is None
    with pytest.warns(UserWarning, match="prompt version"):
        assert Calibration.bundled(tmp_path, {**served, "prompt_version": "other"}) is None
