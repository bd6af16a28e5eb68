"""The shared-dataset fixture: a skip on a laptop, a failure under CI=true."""

from __future__ import annotations

import textwrap
from pathlib import Path

pytest_plugins = ["pytester"]


def _run_against_missing_data(pytester, monkeypatch, ci: str | None):
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_needs_data=textwrap.dedent("""
        def test_needs_data(data_dir):
            assert data_dir.exists()
    """))
    monkeypatch.setenv("ONEPASS_SHARED_DIR", str(pytester.path / "no-such-shared-dir"))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    return pytester.runpytest_subprocess("-q", "-rs")


def test_missing_datasets_skip_outside_ci(pytester, monkeypatch):
    result = _run_against_missing_data(pytester, monkeypatch, None)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*shared datasets not found*"])


def test_missing_datasets_fail_under_ci(pytester, monkeypatch):
    result = _run_against_missing_data(pytester, monkeypatch, "true")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*shared datasets not found*CI must run every test*"])
