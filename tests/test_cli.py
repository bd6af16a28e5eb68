"""`onepass decide` end to end, as a user runs it: a real process on the embedded model."""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onepass.cli", *args],
        capture_output=True, text=True, input=stdin, timeout=600,
    )


def test_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0 and "decide" in out.stdout


def test_decide_answers_good_lines_and_records_bad_ones(tmp_path, engine):
    good = json.loads((EXAMPLES / "request_mixed.json").read_text())
    lines = [
        json.dumps({"id": "a", **good}),
        "",  # blank lines are skipped
        "{not json",
        json.dumps({"id": "b", "state": "x", "questions": {}}),
        json.dumps({"id": 7, "state": "x", "questions": {
            "q": {"type": "score", "instructions": "?", "criteria": [str(i) for i in range(11)]}}}),
        json.dumps({"id": "c", **good, "model": "gpt-4"}),
        json.dumps(good),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    dst = tmp_path / "out.jsonl"
    out = run_cli("decide", "--input", str(src), "--output", str(dst))
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in dst.read_text().splitlines()]
    assert len(records) == 6
    first, bad_json, empty, eleven, unknown_model, last = records
    assert first["id"] == "a" and set(first["answers"]) == set(good["questions"])
    expected = engine.answer(good)["answers"]  # the CLI reads the same numbers as the library
    for name in ("refund_eligible", "approved"):
        assert abs(first["answers"][name]["noul"] - expected[name]["noul"]) < 1e-4
    dept = "responsible_department"
    assert first["answers"][dept]["choice"] == expected[dept]["choice"]
    assert bad_json["line"] == 3 and bad_json["error"]["type"] == "invalid_json"
    assert empty["id"] == "b" and empty["error"]["field"] == "questions"
    assert eleven["id"] == 7 and "got 11" in eleven["error"]["message"]
    assert unknown_model["error"]["type"] == "model_not_found"
    # every line reuses the system prompt pinned at start-up; only the repeated state (the last
    # line, same state as the first) also reuses a cached state prefix
    pinned = engine.pinned_tokens
    assert pinned > 0
    assert first["usage"]["cached_tokens"] == pinned
    assert "id" not in last and last["usage"]["cached_tokens"] > pinned
    summary = out.stderr.strip().splitlines()[-1]
    assert "lines=6" in summary and "errors=4" in summary
    assert f"pinned_tokens={pinned} cache_hits=1 " in summary, summary


def test_decide_reads_stdin_and_writes_stdout():
    request = json.loads((EXAMPLES / "request_score.json").read_text())
    out = run_cli("decide", "--input", "-", "--output", "-", stdin=json.dumps(request) + "\n")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)["answers"]["urgency"]
    assert answer["type"] == "score" and set(answer["legend"]) == {"0", "1", "2"}
