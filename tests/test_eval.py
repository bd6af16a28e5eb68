"""onepass eval: metric definitions, the report layout, the plot and the Markdown summary."""

from __future__ import annotations

import json

import pytest
from train_support import RECORDS, single_thread, tiny_base, write_dataset

from onepass.contract import parse_request
from onepass.evaluate import (
    brier_score,
    calibration_bins,
    expected_calibration_error,
    markdown_report,
    prediction_from_answer,
    summarize,
)

one_thread = pytest.fixture(scope="module", autouse=True)(single_thread)


def test_brier_is_the_multiclass_squared_error():
    assert brier_score([0.7, 0.2, 0.1], 0) == pytest.approx(0.09 + 0.04 + 0.01)
    assert brier_score([1.0, 0.0], 0) == 0.0
    assert brier_score([0.0, 1.0], 0) == pytest.approx(2.0)


def test_ece_uses_ten_equal_width_bins():
    confidences = [0.9, 0.9, 0.6, 0.3]
    correct = [True, False, True, False]
    # bin 9: acc .5 vs conf .9 (2 of 4); bin 6: 1 vs .6; bin 3: 0 vs .3
    assert expected_calibration_error(confidences, correct) == pytest.approx(
        0.5 * 0.4 + 0.25 * 0.4 + 0.25 * 0.3)
    bins = calibration_bins([0.0, 0.1, 0.55, 1.0], [True] * 4)
    assert len(bins) == 10 and bins[0]["lower"] == 0.0 and bins[9]["upper"] == 1.0
    assert [b["count"] for b in bins] == [1, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert expected_calibration_error([], []) == 0.0
    assert expected_calibration_error([0.8] * 5, [True] * 4 + [False]) == pytest.approx(0.0)


def test_predictions_and_summary_per_type():
    req = parse_request({"state": "s", "questions": {
        "n": {"type": "noul", "instructions": "x"},
        "c": {"type": "choice", "instructions": "x", "criteria": {"a": None, "b": None,
                                                                   "c": None}},
        "s": {"type": "score", "instructions": "x", "criteria": ["lo", "mid", "hi"]}}})
    n, c, s = req.questions
    tie = prediction_from_answer(n, 1, {"type": "noul", "noul": 0.5}, "f:1")
    assert tie.predicted == 0 and not tie.correct  # P(yes) >= 0.5 reads as yes
    choice = prediction_from_answer(c, 2, {"type": "choice", "choice": "c", "probabilities": {
        "a": 0.1, "b": 0.3, "c": 0.6}, "confidence": 0.4}, "f:1")
    assert choice.correct and choice.probabilities == (0.1, 0.3, 0.6)
    score = prediction_from_answer(s, 0, {"type": "score", "score": 0.7, "probabilities": {
        "0": 0.5, "1": 0.3, "2": 0.2}, "confidence": 0.1, "legend": {}}, "f:1")
    assert score.correct and score.score == 0.7
    summary = summarize([score, score])
    assert summary["mae"] == pytest.approx(0.7) and summary["type"] == "score"
    confusion = summarize([choice, prediction_from_answer(
        c, 0, {"type": "choice", "choice": "b", "probabilities": {"a": 0.2, "b": 0.5, "c": 0.3},
               "confidence": 0.2}, "f:2")])["confusion"]
    assert confusion["labels"] == ["a", "b", "c"]
    assert confusion["matrix"] == [[0, 1, 0], [0, 0, 0], [0, 0, 1]]


def test_eval_command_writes_report_plot_and_markdown(tmp_path, capsys):
    from onepass.cli import main

    base = tiny_base(tmp_path / "base")
    dataset = write_dataset(tmp_path / "test.jsonl", RECORDS[:4])
    report_path, plots = tmp_path / "out" / "report.json", tmp_path / "plots"
    assert main(["eval", "--model", str(base), "--dataset", str(dataset), "--device", "cpu",
                 "--output", str(report_path), "--plot", str(plots)]) == 0
    report = json.loads(report_path.read_text())
    assert {"accuracy", "brier", "ece", "questions", "per_question"} <= report.keys()
    assert report["questions"] == 12 and report["records"] == 4 and report["ece_bins"] == 10
    assert set(report["per_question"]) == {"refund", "team", "urgency"}
    assert report["per_question"]["team"]["confusion"]["labels"] == [
        "billing", "logistics", "support"]
    assert sum(map(sum, report["per_question"]["refund"]["confusion"]["matrix"])) == 4
    assert "mae" in report["per_question"]["urgency"]
    correct = [p["gold"] == p["predicted"] for p in report["predictions"]]
    assert report["accuracy"] == pytest.approx(sum(correct) / len(correct))
    assert report["throughput"]["questions_per_second"] > 0
    assert (plots / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (plots / "report.md").read_text()
    assert "10 equal-width bins" in markdown and "reliability.png" in markdown
    assert "Confusion for `team`" in markdown
    # a random-weight model spreads its probability over the whole vocabulary: the labels get
    # almost none of it, and eval says so
    health = report["label_health"]
    assert health["answers"] == 12 and 0 <= health["min_label_mass"] <= health[
        "median_label_mass"] < 0.05 and health["low"] is True
    err = " ".join(capsys.readouterr().err.split())
    assert "label health: median label mass" in err
    assert "warning: the median answer put less than 50% of the model's probability" in err


def test_label_health_summarises_the_answers_diagnostics():
    from onepass.evaluate import label_health

    assert label_health([]) is None
    health = label_health([{"label_mass": m, "argmax_is_label": m > 0.5}
                           for m in (0.9, 0.2, 0.6, 0.4)])
    assert health == {"answers": 4, "median_label_mass": pytest.approx(0.5),
                      "min_label_mass": 0.2, "argmax_is_label": 0.5, "low": False}
    assert label_health([{"label_mass": 0.3, "argmax_is_label": False}])["low"] is True


def test_label_health_is_read_for_the_first_records_where_the_backend_can():
    from types import SimpleNamespace

    from onepass.evaluate import LABEL_HEALTH_RECORDS, diagnosed

    request = parse_request({"state": "s", "questions": {"n": {"type": "noul",
                                                               "instructions": "x"}}})
    reads = SimpleNamespace(capabilities=SimpleNamespace(vocab_statistics=True))
    assert diagnosed(reads, request, 0).diagnostics is True
    assert diagnosed(reads, request, LABEL_HEALTH_RECORDS - 1).diagnostics is True
    assert diagnosed(reads, request, LABEL_HEALTH_RECORDS) is request
    blind = SimpleNamespace(capabilities=SimpleNamespace(vocab_statistics=False))
    assert diagnosed(blind, request, 0) is request


def test_eval_command_rejects_a_bad_dataset(tmp_path, capsys):
    from onepass.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n{oops\n")
    assert main(["eval", "--dataset", str(bad)]) == 2
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err


def test_markdown_report_states_the_binning():
    report = {"accuracy": 0.5, "brier": 0.4, "ece": 0.1, "questions": 2, "records": 2,
              "per_question": {}, "throughput": {"questions_per_second": 1.0,
                                                 "input_tokens_per_second": 10.0,
                                                 "seconds": 2.0}}
    text = markdown_report(report)
    assert "| **overall** | 0.500 | 0.400 | 0.100 | 2 |" in text
    assert "ECE over 10 equal-width bins" in text
