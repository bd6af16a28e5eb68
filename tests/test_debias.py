"""Order-invariant answers (``debias="rotations"``): every cyclic rotation of a question's
options read in the same packed forward and combined back in declared order."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import pytest

from onepass.commands.common import apply_quality
from onepass.contract import DEBIAS_MODES, ContractError, parse_request
from onepass.engine import DecisionEngine
from onepass.option_order import DEFAULT_DEBIAS, carry, default_debias, order_warning
from onepass.readout import combine_rotations, divide_prior

TOL = 1e-4
TEAMS = {
    "billing": "money, invoices, refunds",
    "shipping": "delivery, parcels, tracking",
    "technical": "bugs, errors, crashes",
    "account": "login, password, profile",
}
STATE = "I was charged twice for my order last month and want my money back."


def _choice(order, debias=None):
    request = {"state": STATE, "questions": {"team": {
        "type": "choice", "instructions": "Which team should handle this?",
        "criteria": {k: TEAMS[k] for k in order}}}}
    if debias:
        request["debias"] = debias
    return request


def _probs(engine, order, **kw):
    answer = engine.answer(_choice(order), **kw)["answers"]["team"]
    return {k: answer["probabilities"][k] for k in TEAMS}, answer


def test_combine_rules():
    a, b = [0.8, 0.2], [0.2, 0.8]
    assert combine_rotations([a, b], "mean") == pytest.approx([0.5, 0.5])
    assert combine_rotations([a, b], "logmean") == pytest.approx([0.5, 0.5])
    skew = [[0.9, 0.1], [0.5, 0.5]]
    assert combine_rotations(skew, "mean") == pytest.approx([0.7, 0.3])
    # geometric mean: sqrt(.45) vs sqrt(.05), renormalised
    assert combine_rotations(skew, "logmean")[0] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="combine rule"):
        combine_rotations(skew, "median")


def test_contract_debias_field():
    assert parse_request(_choice(TEAMS, "rotations")).debias == "rotations"
    assert parse_request(_choice(TEAMS)).debias is None
    assert parse_request(_choice(TEAMS, "rotations+content-free")).debias == \
        "rotations+content-free"
    assert parse_request(_choice(TEAMS, "name-order")).debias == "name-order"
    for bad in ("all", 1, True, "content-free+rotations", "name-order+rotations"):
        with pytest.raises(ContractError) as err:
            parse_request(_choice(TEAMS, bad))
        assert err.value.field == "debias"


def test_rotations_are_order_invariant_and_none_is_not(engine):
    orders = [list(TEAMS), list(reversed(TEAMS)), [*list(TEAMS)[2:], *list(TEAMS)[:2]],
              ["technical", "billing", "account", "shipping"]]
    none = [_probs(engine, o, debias="none")[0] for o in orders]
    moved = max(abs(none[0][k] - p[k]) for p in none[1:] for k in TEAMS)
    assert moved > 0.02, "the fixed case should show the model's order bias without debias"
    rotated = [_probs(engine, o, debias="rotations") for o in orders]
    for probs, answer in rotated[1:]:
        assert max(abs(probs[k] - rotated[0][0][k]) for k in TEAMS) < TOL
        assert answer["choice"] == rotated[0][1]["choice"]
    assert sum(rotated[0][0].values()) == pytest.approx(1.0)


def test_name_order_is_order_invariant_at_the_cost_of_none(engine):
    """Any permutation of the declared options reads the same prompt: the same distribution,
    bit for bit, mapped back to each declaration, from one suffix as under ``none``."""
    orders = [list(TEAMS), list(reversed(TEAMS)), ["technical", "billing", "account", "shipping"]]
    named = [_probs(engine, o, debias="name-order") for o in orders]
    for probs, answer in named[1:]:
        assert probs == named[0][0] and answer["choice"] == named[0][1]["choice"]
    # it is the declared-order reading of the options sorted by name
    assert _probs(engine, sorted(TEAMS), debias="none")[0] == named[0][0]
    plain = engine.answer(_choice(orders[1]), debias="none")["usage"]
    assert engine.answer(_choice(orders[1], "name-order"))["usage"] == plain


def test_name_order_keeps_noul_and_score_orders(engine):
    q = parse_request({"state": "x", "questions": {
        "n": {"type": "noul", "instructions": "It is raining."},
        "s": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
        "c": {"type": "choice", "instructions": "Pick", "criteria": {"b": None, "c": None,
                                                                     "a": None}},
    }}).questions
    for question in q[:2]:
        assert engine.readings(question, "name-order") == engine.readings(question, "none")
    ((position, order),) = engine.readings(q[2], "name-order+content-free")
    assert order == (2, 0, 1)
    assert all(line in position.suffix for line in ("A) a", "B) b", "C) c"))


def test_rotations_read_more_suffixes_in_one_forward(engine):
    plain = engine.answer(_choice(TEAMS), debias="none")["usage"]
    rotated = engine.answer(_choice(TEAMS, "rotations"))["usage"]  # the request's field
    assert rotated["output_tokens"] == plain["output_tokens"] == 1
    # four suffixes after the one shared prefix: more input, the prefix still counted once
    assert 3 * plain["input_tokens"] < rotated["input_tokens"] + 3 * rotated["cached_tokens"]
    assert rotated["input_tokens"] > plain["input_tokens"]


def test_rotation_readings(engine):
    q = parse_request({"state": "x", "questions": {
        "n": {"type": "noul", "instructions": "It is raining."},
        "s": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
        "c": {"type": "choice", "instructions": "Pick", "criteria": {"b": None, "a": None}},
    }}).questions
    noul = engine.readings(q[0], "rotations")
    assert len(noul) == 2 and all(order == (0, 1) for _, order in noul)
    swapped = noul[1][0]
    assert [lb.text for lb in swapped.labels] == ["B", "A"]  # "yes" read from B, "no" from A
    assert "B) Yes" in swapped.suffix and "A) No" in swapped.suffix
    score = engine.readings(q[1], "rotations")
    assert [[lb.text for lb in p.labels] for p, _ in score] == [
        ["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"]]
    choice = engine.readings(q[2], "rotations")
    assert [order for _, order in choice] == [(1, 0), (0, 1)]  # canonical: a, b
    assert engine.readings(q[2], "none")[0][1] == (0, 1)


def test_noul_and_score_rotations_match_naive(engine):
    request = {"state": STATE, "debias": "rotations", "questions": {
        "refund": {"type": "noul", "instructions": "The customer wants a refund."},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["low", "medium", "high"]},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS}}}
    fast = engine.answer(request)["answers"]
    naive = engine.answer(request, naive=True)["answers"]
    # float32: the fast path's 1e-4; a bfloat16 forward rounds activations to ~3 digits, and
    # packing changes the order of its sums (the rotation bookkeeping is the same in both)
    ENGINE_TOL = TOL if engine.identity()["dtype"] == "float32" else 2e-2
    assert abs(fast["refund"]["noul"] - naive["refund"]["noul"]) < ENGINE_TOL
    for name in ("urgency", "team"):
        for k, p in fast[name]["probabilities"].items():
            assert abs(p - naive[name]["probabilities"][k]) < ENGINE_TOL


def test_engine_default_and_per_call_override(engine):
    saved = engine.debias
    try:
        engine.debias = "rotations"
        default = engine.answer(_choice(TEAMS))["usage"]["input_tokens"]
        overridden = engine.answer(_choice(TEAMS, "none"))["usage"]["input_tokens"]
        per_call = engine.choice(STATE, "Which team should handle this?", TEAMS, debias="none")
        assert overridden < default
        assert per_call.probabilities == pytest.approx(
            _probs(engine, TEAMS, debias="none")[0], abs=TOL)
    finally:
        engine.debias = saved
    with pytest.raises(ValueError, match="debias"):
        engine.answer(_choice(TEAMS), debias="shuffle")


def _trained(folder, option_orders=None):
    """A folder with the adapter_config.json onepass train writes (no field: an adapter from
    before the trainer recorded its order, trained on the declared order)."""
    folder.mkdir(exist_ok=True)
    config = {"format": "onepass-lora"}
    if option_orders is not None:
        config["option_orders"] = option_orders
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return str(folder)


def test_the_default_reads_in_name_order_unless_the_weights_were_trained_otherwise(
        engine, tmp_path):
    """name-order is the default; weights onepass trained in another order are read the way
    they were trained (an adapter that learned the letters is at chance in another order)."""
    assert DEFAULT_DEBIAS == "name-order"
    assert DecisionEngine(engine.backend).debias == "name-order"
    for orders, want in ((None, "none"), ("declared", "none"), ("name", "name-order"),
                         ("rotations", "name-order")):
        adapter = _trained(tmp_path / f"adapter-{orders}", orders)
        assert default_debias(adapter) == want
        assert DecisionEngine(engine.backend, adapter=adapter).debias == want
    # a trained checkpoint's summary, or the calibration merge and quantize carry along
    full = tmp_path / "full"
    full.mkdir()
    (full / "training_summary.json").write_text(json.dumps(
        {"configuration": {"dataset": {"option_orders": "declared"}}}))
    assert DecisionEngine(engine.backend, trained=str(full)).debias == "none"
    for broken in ('{"configuration": {"dataset": "x"}}', "[1, 2]", "not json"):
        (full / "training_summary.json").write_text(broken)  # a hand-edited file: no crash
        assert default_debias(full) in ("none", "name-order")
    merged = tmp_path / "merged"
    merged.mkdir()
    for debias, want in (("none", "none"), ("name-order", "name-order"),
                         ("rotations+content-free", "name-order")):
        (merged / "calibration.json").write_text(json.dumps({"debias": debias}))
        assert default_debias(merged) == want
    assert default_debias(tmp_path / "missing") == default_debias(None) == "name-order"
    peft = tmp_path / "peft"  # a peft adapter_config.json says nothing about onepass's orders
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    assert default_debias(peft) == "name-order"


def test_merge_and_quantize_carry_the_training_order(tmp_path):
    """A checkpoint made from trained weights (``option_order.carry``, as merge and quantize
    call it) defaults to the order they were trained in, with or without a calibration."""
    declared = Path(_trained(tmp_path / "declared", "declared"))
    assert carry(declared, tmp_path / "merged")  # an adapter without its summary
    assert default_debias(tmp_path / "merged") == "none"
    named = Path(_trained(tmp_path / "named", "name"))
    (named / "training_summary.json").write_text(json.dumps(
        {"method": "lora", "configuration": {"dataset": {"option_orders": "name"}}}))
    assert carry(named, tmp_path / "quantized")  # the trainer's summary, copied
    assert json.loads((tmp_path / "quantized" / "training_summary.json").read_text())[
        "method"] == "lora"
    assert default_debias(tmp_path / "quantized") == "name-order"
    assert not carry(None, tmp_path / "plain") and not carry(tmp_path / "missing", tmp_path / "x")
    assert not (tmp_path / "plain").exists()


def test_weights_read_in_another_order_than_trained_warn(engine, tmp_path):
    declared = _trained(tmp_path / "declared")  # no field: the declared order
    with pytest.warns(UserWarning, match="trained on the declared option order"):
        DecisionEngine(engine.backend, adapter=declared, debias="rotations+content-free")
    with pytest.warns(UserWarning, match="trained on the declared option order"):
        DecisionEngine(engine.backend, adapter=declared, debias="name-order")
    named = _trained(tmp_path / "named", "name")
    with pytest.warns(UserWarning, match="trained with the options in name order"):
        DecisionEngine(engine.backend, adapter=named, debias="content-free")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DecisionEngine(engine.backend, adapter=declared, debias="content-free")
        DecisionEngine(engine.backend, adapter=declared)
        DecisionEngine(engine.backend, adapter=named, debias="rotations")
        DecisionEngine(engine.backend, debias="rotations")
    rotated = _trained(tmp_path / "rotated", "rotations")
    for debias in DEBIAS_MODES:
        assert order_warning(rotated, debias) is None
        assert order_warning(None, debias) is None


def test_the_cli_flags_warn_about_weights_read_in_another_order(engine, capsys, tmp_path):
    saved = engine.trained, engine.debias
    try:
        engine.trained = _trained(tmp_path / "declared", "declared")
        engine.debias = "none"
        apply_quality(engine, argparse.Namespace(debias=None, calibration=None,
                                                 abstain_below=None))
        assert engine.debias == "none"  # no flag: the engine's default stays
        assert capsys.readouterr().err == ""
        apply_quality(engine, argparse.Namespace(debias="rotations", calibration=None,
                                                 abstain_below=None))
        assert "trained on the declared option order" in capsys.readouterr().err
        apply_quality(engine, argparse.Namespace(debias="none", calibration=None,
                                                 abstain_below=None))
        assert capsys.readouterr().err == ""
    finally:
        engine.trained, engine.debias = saved


def test_a_calibration_file_is_applied_in_the_mode_it_was_fitted_in(engine, capsys, tmp_path):
    """--calibration without --debias reads requests the way the file was fitted (a file from
    before name-order was the default applies as it did); with another --debias it warns."""
    from onepass.calibration import Calibration

    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(Calibration(identity=engine.identity(), method="fit",
                                           debias="none").to_json()))
    saved = engine.debias, engine.calibration, engine.abstain_below
    try:
        engine.debias = "name-order"
        apply_quality(engine, argparse.Namespace(debias=None, calibration=str(path),
                                                 abstain_below=None))
        assert engine.debias == "none" and engine.calibration.debias == "none"
        assert capsys.readouterr().err == ""
        apply_quality(engine, argparse.Namespace(debias="name-order", calibration=str(path),
                                                 abstain_below=None))
        assert engine.debias == "name-order"
        assert "fitted with --debias none" in capsys.readouterr().err
    finally:
        engine.debias = saved[0]
        engine.set_calibration(saved[1])
        engine.set_abstain_below(saved[2])


def test_many_options_read_capped_rotations_that_do_not_depend_on_order(engine):
    def question(names):
        return parse_request({"state": "x", "questions": {"c": {
            "type": "choice", "instructions": "Pick", "criteria": dict.fromkeys(names)}}
        }).questions[0]

    names = [f"option {i:02d}" for i in range(30)]
    forward = engine.readings(question(names), "rotations")
    backward = engine.readings(question(names[::-1]), "rotations")
    assert len(forward) == engine.max_rotations == 16
    # the same prompts in the same order, whatever the declared order
    assert [p.suffix for p, _ in forward] == [p.suffix for p, _ in backward]
    firsts = {names[order[0]] for _, order in forward}
    assert len(firsts) == 16  # evenly spaced: a different option leads each reading


# --------------------------------------------------------------------------- content-free prior


def test_divide_prior():
    assert divide_prior([0.7, 0.3], [0.7, 0.3]) == pytest.approx([0.5, 0.5])
    # p / q renormalised: (0.6/0.3, 0.4/0.7) -> (2, 4/7)
    assert divide_prior([0.6, 0.4], [0.3, 0.7]) == pytest.approx([0.7777778, 0.2222222])
    assert divide_prior([0.2, 0.3, 0.5], [1 / 3] * 3) == pytest.approx([0.2, 0.3, 0.5])


def test_content_free_divides_by_the_same_question_about_a_blank_document(engine):
    from onepass.engine import CONTENT_FREE_STATE

    request = {"state": STATE, "questions": {
        "refund": {"type": "noul", "instructions": "The customer wants a refund."},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["low", "medium", "high"]},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS}}}
    blank = {**request, "state": CONTENT_FREE_STATE}
    for mode, base in (("content-free", "none"), ("rotations+content-free", "rotations")):
        got = engine.answer(request, debias=mode)
        seen = engine.answer(request, debias=base)["answers"]
        prior = engine.answer(blank, debias=base)["answers"]
        want = divide_prior([seen["refund"]["noul"], 1 - seen["refund"]["noul"]],
                            [prior["refund"]["noul"], 1 - prior["refund"]["noul"]])
        assert got["answers"]["refund"]["noul"] == pytest.approx(want[0], abs=TOL)
        for name in ("urgency", "team"):
            keys = list(seen[name]["probabilities"])
            want = divide_prior([seen[name]["probabilities"][k] for k in keys],
                                [prior[name]["probabilities"][k] for k in keys])
            assert [got["answers"][name]["probabilities"][k] for k in keys] == pytest.approx(
                want, abs=TOL)
        # the blank document's prefix is the same for every request: a cache hit after the first
        again = engine.answer({**request, "state": STATE + " Thanks."}, debias=mode)["usage"]
        assert again["cached_tokens"] > 0
    # still order-invariant with rotations
    orders = [list(TEAMS), list(reversed(TEAMS))]
    combined = [_probs(engine, o, debias="rotations+content-free")[0] for o in orders]
    assert max(abs(combined[0][k] - combined[1][k]) for k in TEAMS) < TOL


def test_content_free_fast_path_matches_naive(engine):
    request = {"state": STATE, "debias": "rotations+content-free", "questions": {
        "refund": {"type": "noul", "instructions": "The customer wants a refund."},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS}}}
    fast = engine.answer(request)["answers"]
    naive = engine.answer(request, naive=True)["answers"]
    tol = TOL if engine.identity()["dtype"] == "float32" else 2e-2
    assert abs(fast["refund"]["noul"] - naive["refund"]["noul"]) < tol
    for k, p in fast["team"]["probabilities"].items():
        assert abs(p - naive["team"]["probabilities"][k]) < tol
