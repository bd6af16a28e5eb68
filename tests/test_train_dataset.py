"""Dataset loading and validation: every error names the file and the line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onepass.train.dataset import DatasetError, answer_index, load_dataset, split_records

CHOICE = {"type": "choice", "instructions": "Dept?",
          "criteria": {"billing": "Payments", "technical": "Bugs"}, "answer": "technical"}
NOUL = {"type": "noul", "instructions": "Refund?", "answer": "yes"}
SCORE = {"type": "score", "instructions": "Urgent?",
         "criteria": ["Routine", "Urgent", "Emergency"], "answer": "Urgent"}
GOOD = {"state": "charged twice", "questions": {"refund": NOUL, "dept": CHOICE, "urg": SCORE}}
SOFT = {k: v for k, v in CHOICE.items() if k != "answer"}


def write_lines(tmp_path: Path, lines: list, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def error_of(path: Path) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    return info.value


def test_valid_jsonl_maps_semantic_answers_to_option_indices(tmp_path):
    path = write_lines(tmp_path, [GOOD, {"state": {"order": 7}, "questions": {"dept": {
        **CHOICE, "answer": "billing"}}}])
    records = load_dataset(path)
    assert [r.answers for r in records] == [(0, 1, 1), (0,)]
    assert records[0].source == f"{path}:1" and records[1].source == f"{path}:2"
    assert [q.name for q in records[0].questions] == ["refund", "dept", "urg"]
    assert "answer" not in json.dumps(records[0].request.questions[1].descriptions)


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path):
    path = write_lines(tmp_path, [GOOD, "", {"state": "x", "questions": {"q": {
        **CHOICE, "answer": "nope"}}}])
    err = error_of(path)
    assert err.line == 3 and str(err).startswith(f"{path}:3: ")


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("{not json", "invalid JSON"),
        ([1, 2], "expected a record object"),
        ({**GOOD, "extra": 1}, "unknown key 'extra'"),
        ({"questions": GOOD["questions"]}, "state"),
        ({"state": "s", "questions": {}}, "at least one question"),
        ({"state": "s", "questions": {"q": {**NOUL, "colour": "red"}}},
         "questions.q: unknown key 'colour'"),
        ({"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}},
         "questions.q: missing 'answer'"),
        ({"state": "s", "questions": {"q": {"type": "choice", "instructions": "x",
                                            "answer": "a"}}}, "questions.q.criteria"),
        ({"state": "s", "questions": {"q": {**NOUL, "answer": "maybe"}}},
         "questions.q.answer: expected one of ['yes', 'no']"),
        ({"state": "s", "questions": {"q": {**CHOICE, "answer": "sales"}}},
         "questions.q.answer: expected an option name"),
        ({"state": "s", "questions": {"q": {**SCORE, "answer": "Critical"}}},
         "questions.q.answer: expected a level name"),
        ({"state": "s", "questions": {"q": {**SCORE, "answer": 1}}},
         "questions.q.answer: expected a level name"),
        ({"state": "s", "questions": {"q": {"type": "box", "instructions": "x",
                                            "answer": "a"}}}, "questions.q.type"),
        # soft targets (distillation), attacked field by field
        ({"state": "s", "questions": {"q": {**NOUL, "probabilities": {"yes": 1, "no": 0}}}},
         "questions.q: give 'answer' or 'probabilities', not both"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": [0.5, 0.5]}}},
         "questions.q.probabilities: expected an object of probabilities by option"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {}}}},
         "questions.q.probabilities: expected an object"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {"billing": 1.0}}}},
         "questions.q.probabilities: missing a probability for 'technical'"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {
            "billing": 0.5, "technical": 0.4, "sales": 0.1}}}},
         "questions.q.probabilities: key \"sales\": expected an option name"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {
            "billing": -0.5, "technical": 1.5}}}},
         "questions.q.probabilities: billing: expected a probability in [0, 1], got -0.5"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {
            "billing": True, "technical": 0.0}}}}, "got true"),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {
            "billing": "0.5", "technical": 0.5}}}}, "got \"0.5\""),
        ({"state": "s", "questions": {"q": {**SOFT, "probabilities": {
            "billing": 0.5, "technical": 0.4}}}}, "sum to 0.9, not 1"),
        ('{"state": "s", "questions": {"q": {"type": "noul", "instructions": "x", '
         '"probabilities": {"yes": NaN, "no": 0.5}}}}', "yes: expected a probability"),
        ({"state": "s", "questions": {"q": {"type": "noul", "instructions": "x",
                                            "probabilities": {"yes": 0.5, "Yes": 0.5}}}},
         "key \"Yes\": names an option already given"),
    ],
)
def test_each_error_names_file_and_line(tmp_path, bad, fragment):
    path = write_lines(tmp_path, [GOOD, GOOD, bad])
    err = error_of(path)
    assert err.path == str(path) and err.line == 3
    assert str(err).startswith(f"{path}:3: ")
    assert fragment in str(err)


def test_a_target_distribution_is_kept_in_option_order_and_its_argmax_is_the_answer(tmp_path):
    record = {"state": "charged twice", "questions": {
        "refund": {"type": "noul", "instructions": "Refund?",
                   "probabilities": {"no": 0.2, "yes": 0.8}},
        "dept": {**SOFT, "probabilities": {"technical": 0.3, "billing": 0.6999}},
        "urg": SCORE}}
    (parsed,) = load_dataset(write_lines(tmp_path, [record]))
    assert parsed.answers == (0, 0, 1)
    refund, dept, urg = parsed.distributions
    assert refund == pytest.approx((0.8, 0.2)) and urg is None
    assert dept == pytest.approx((0.6999 / 0.9999, 0.3 / 0.9999))  # normalised
    assert sum(dept) == pytest.approx(1.0, abs=1e-12)
    assert "probabilities" not in json.dumps(parsed.request.questions[0].instructions)


def test_custom_noul_labels_and_true_false_keys(tmp_path):
    custom = {"type": "noul", "instructions": "Approved.",
              "criteria": {"yes": "Approved", "no": "Rejected"}}
    tf = {"type": "noul", "instructions": "True?", "criteria": {"true": "ok", "false": "ko"}}
    path = write_lines(tmp_path, [
        {"state": "s", "questions": {"a": {**custom, "answer": "Rejected"}}},
        {"state": "s", "questions": {"a": {**custom, "answer": "YES"}}},
        {"state": "s", "questions": {"a": {**tf, "answer": "false"}}},
    ])
    assert [r.answers for r in load_dataset(path)] == [(1,), (0,), (1,)]
    bad = write_lines(tmp_path, [{"state": "s", "questions": {"a": {**tf, "answer": "yes"}}}],
                      "bad.jsonl")
    assert "expected one of ['true', 'false', 'ok', 'ko']" in str(error_of(bad))


def test_json_single_record_and_array_with_element_lines(tmp_path):
    single = tmp_path / "one.JSON"  # extension case-insensitive
    single.write_text(json.dumps(GOOD, indent=2))
    assert len(load_dataset(single)) == 1
    array = tmp_path / "many.json"
    good = json.dumps(GOOD, indent=2)
    bad = json.dumps({"state": "s", "questions": {"q": {**CHOICE, "answer": "x"}}}, indent=2)
    array.write_text(f"[\n{good},\n{bad}\n]\n")
    err = error_of(array)
    assert err.line == 2 + good.count("\n") + 1  # the line where the second record starts
    array.write_text(f"[\n{good},\n{good}\n]\n")
    records = load_dataset(array)
    assert records[1].source == f"{array}:{2 + good.count(chr(10)) + 1}"
    broken = tmp_path / "broken.json"
    broken.write_text("[\n" + good + ",\n  {\"state\": oops}\n]")
    assert error_of(broken).line == 2 + good.count("\n") + 1
    upper = tmp_path / "data.JSONL"
    upper.write_text(json.dumps(GOOD) + "\n")
    assert len(load_dataset(upper)) == 1


def test_file_level_errors(tmp_path):
    assert "expected a .jsonl or .json file" in str(error_of(tmp_path / "data.csv"))
    assert "file not found" in str(error_of(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert "empty" in str(error_of(empty))
    trailing = tmp_path / "t.json"
    trailing.write_text("[" + json.dumps(GOOD) + "] extra")
    assert "unexpected data after the array" in str(error_of(trailing))


def test_answer_index_rules():
    from onepass.contract import parse_request

    req = parse_request({"state": "s", "questions": {
        "n": {"type": "noul", "instructions": "x"},
        "s": {"type": "score", "instructions": "x", "criteria": [{"a": 1}, "two"]}}})
    n, s = req.questions
    assert answer_index(n, " No ") == 1
    assert answer_index(s, {"a": 1}) == 0 and answer_index(s, "two") == 1


def test_validation_split_is_fixed_and_disjoint(tmp_path):
    lines = [{"state": f"s{i}", "questions": {"q": NOUL}} for i in range(20)]
    records = load_dataset(write_lines(tmp_path, lines))
    path = tmp_path / "data.jsonl"
    train, val = split_records(records, 0.25, 3, path)
    again_train, again_val = split_records(records, 0.25, 3, path)
    assert [r.source for r in val] == [r.source for r in again_val]
    assert len(val) == 5 and len(train) == 15
    assert not {r.source for r in train} & {r.source for r in val}
    assert [r.source for r in split_records(records, 0.25, 4, path)[1]] != [
        r.source for r in val]
    with pytest.raises(DatasetError, match=f"^{path}: validation split: expected a fraction"):
        split_records(records, 1.5, 0, path)
    with pytest.raises(DatasetError, match=f"^{path}: validation split 0.5 of 1 records leaves"):
        split_records(records[:1], 0.5, 0, path)


def test_cli_reports_an_impossible_split_in_one_line(tmp_path):
    """`onepass train` turns a split that leaves nothing to train on into one clean line."""
    path = write_lines(tmp_path, [GOOD])
    done = subprocess.run(
        [sys.executable, "-m", "onepass.cli", "train", "--method", "lora", "--dataset", str(path),
         "--validation-split", "0.5", "--output-directory", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"onepass train: {path}: validation split 0.5 of 1 records leaves nothing to train on; "
        "add records, lower --validation-split or give --validation-dataset"
    ]
