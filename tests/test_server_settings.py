"""`onepass serve` configuration: every flag documented, the defaults the README states are
the defaults in force, flag > ONEPASS_<FLAG> > default, bad values (from a flag or from the
environment alike) refused at start-up in one line, and the warning for an open,
unauthenticated bind."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from onepass.cli import build_parser  # noqa: E402
from onepass.commands.serve import settings_from_args, warn_if_open  # noqa: E402
from onepass.server.settings import ServerSettings  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"

SERVER_FLAGS = ["--host", "--port", "--api-key", "--max-body-bytes", "--max-questions",
                "--max-queue", "--request-deadline", "--workers", "--threads",
                "--drain-seconds", "--log-level"]
MODEL_FLAGS = ["--model", "--served-model-name", "--device", "--dtype", "--context-path",
               "--session-cache-entries", "--session-cache-tokens", "--max-input-tokens",
               "--stream-slowdown"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """The caller's ONEPASS_* variables must not leak into what these tests parse."""
    for name in os.environ:
        if name.startswith("ONEPASS_"):
            monkeypatch.delenv(name)


def parse(argv: list[str]):
    return build_parser().parse_args(["serve", *argv])


def serve_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"]


def serve_help() -> str:
    return serve_parser().format_help()


def _documented_value(text: str):
    """``2 MiB`` -> 2097152, ``5 s`` -> 5.0, ``8,192`` -> 8192, an address as is; prose -> None."""
    text = text.split(", ")[0].strip()
    m = re.fullmatch(r"(\d[\d,]*(?:\.\d+)?)\s*(MiB|KiB|s)?", text)
    if m:
        number = float(m.group(1).replace(",", ""))
        scale = {"MiB": 2**20, "KiB": 2**10}.get(m.group(2) or "", 1)
        return number * scale
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def documented_defaults() -> dict[str, object]:
    """Every ``--flag`` (value) / (default value) the README states, by dest name."""
    text = README.read_text(encoding="utf-8")
    found = {}
    for flag, inside in re.findall(r"`(--[a-z-]+)`\s+\((?:default\s+)?([^)]*)\)", text):
        value = _documented_value(" ".join(inside.split()))
        if value is not None:
            found[flag[2:].replace("-", "_")] = value
    entries, tokens = re.search(
        r"bounded by entries and tokens\s+\(defaults ([\d,]+) and ([\d,]+)", text).groups()
    found["session_cache_entries"] = float(entries.replace(",", ""))
    found["session_cache_tokens"] = float(tokens.replace(",", ""))
    (temperature,) = re.search(r"with a temperature\s+\(default ([\d.]+)\)", text).groups()
    found["temperature"] = float(temperature)
    return found


def test_readme_defaults_are_the_defaults_in_force():
    documented = documented_defaults()
    assert set(documented) == {
        "host", "port", "max_body_bytes", "max_questions", "max_queue", "request_deadline",
        "workers", "drain_seconds", "max_input_tokens", "session_cache_entries",
        "session_cache_tokens", "temperature",
    }, "the README stopped documenting a default (or documents a new one: pin it here)"
    parser = serve_parser()
    settings = ServerSettings()
    fields = {f.name for f in dataclasses.fields(ServerSettings)}
    for dest, value in documented.items():
        flag_default = parser.get_default(dest)
        assert flag_default == value, (dest, flag_default, value)
        if dest in fields:
            assert getattr(settings, dest) == value, (dest, getattr(settings, dest), value)
    assert settings_from_args(parse([])) == settings  # no flag, no environment: the same


def test_help_documents_every_flag():
    text = serve_help()
    for flag in SERVER_FLAGS + MODEL_FLAGS:
        assert flag in text, flag
    assert "ONEPASS_<FLAG>" in text


def test_defaults():
    s = settings_from_args(parse([]))
    assert (s.host, s.port, s.api_key) == ("127.0.0.1", 8080, None)
    assert s.request_deadline < 10  # under the official client's read timeout
    assert s.max_queue > 0 and s.max_body_bytes > 0


def test_flag_beats_env_beats_default(monkeypatch):
    monkeypatch.setenv("ONEPASS_MAX_QUEUE", "7")
    monkeypatch.setenv("ONEPASS_REQUEST_DEADLINE", "2.5")
    monkeypatch.setenv("ONEPASS_API_KEY", "from-env")
    monkeypatch.setenv("ONEPASS_SESSION_CACHE_ENTRIES", "3")
    s = settings_from_args(parse([]))
    assert (s.max_queue, s.request_deadline, s.api_key) == (7, 2.5, "from-env")
    assert parse([]).session_cache_entries == 3
    s = settings_from_args(parse(["--max-queue", "9", "--api-key", "from-flag"]))
    assert (s.max_queue, s.request_deadline, s.api_key) == (9, 2.5, "from-flag")


def test_bad_values_are_refused(monkeypatch, capsys):
    monkeypatch.setenv("ONEPASS_PORT", "eighty")
    with pytest.raises(SystemExit) as exit_info:
        parse([])
    assert exit_info.value.code == 2
    assert "ONEPASS_PORT (environment, for --port): invalid int value: 'eighty'" in (
        capsys.readouterr().err)
    assert parse(["--port", "81"]).port == 81  # the flag wins; the environment is not read
    monkeypatch.delenv("ONEPASS_PORT")
    with pytest.raises(SystemExit, match="max_queue: expected an integer > 0, got 0"):
        settings_from_args(parse(["--max-queue", "0"]))
    with pytest.raises(ValueError, match="api_key"):
        ServerSettings(api_key="two words")
    for field, value in [("request_deadline", math.nan), ("request_deadline", math.inf),
                         ("drain_seconds", math.nan), ("drain_seconds", math.inf),
                         ("log_level", "verbose")]:
        with pytest.raises(ValueError, match=field):
            ServerSettings(**{field: value})


@pytest.mark.parametrize(
    "argv,env,fragment",
    [
        (["serve", "--port", "0", "--temperature", "nan"], {},
         "argument --temperature: expected a finite number > 0, got 'nan'"),
        (["serve", "--port", "0"], {"ONEPASS_TEMPERATURE": "nan"},
         "ONEPASS_TEMPERATURE (environment, for --temperature): expected a finite number > 0"),
        (["decide", "--input", "-", "--output", "-"], {"ONEPASS_TEMPERATURE": "inf"},
         "ONEPASS_TEMPERATURE (environment, for --temperature): expected a finite number > 0"),
        (["serve", "--port", "0", "--log-level", "verbose"], {},
         "argument --log-level: invalid choice"),
        (["serve", "--port", "0"], {"ONEPASS_LOG_LEVEL": "verbose"},
         "ONEPASS_LOG_LEVEL (environment, for --log-level): invalid choice: 'verbose'"),
        (["serve", "--port", "0", "--drain-seconds", "inf"], {},
         "drain_seconds: expected a finite number >= 0, got inf"),
        (["serve", "--port", "0"], {"ONEPASS_REQUEST_DEADLINE": "nan"},
         "request_deadline: expected a finite number > 0, got nan"),
        (["serve", "--port", "0", "--stream-slowdown", "1"], {},
         "argument --stream-slowdown: expected 0 or a finite number > 1, got '1'"),
        (["serve", "--port", "0"], {"ONEPASS_STREAM_SLOWDOWN": "inf"},
         "ONEPASS_STREAM_SLOWDOWN (environment, for --stream-slowdown): expected 0 or a finite"),
    ],
)
def test_bad_flag_or_environment_value_stops_start_up_with_one_line(argv, env, fragment):
    """A flag and its ONEPASS_<FLAG> go through the same check, before any model loads: a
    non-zero exit and one clear line, never a traceback or a server that answers 500."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    out = subprocess.run([sys.executable, "-m", "onepass.cli", *argv], env={**clean, **env},
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "host,key,level,fragment",
    [
        ("127.0.0.1", None, logging.INFO, "auth off"),
        ("localhost", None, logging.INFO, "auth off"),
        ("::1", None, logging.INFO, "auth off"),
        ("0.0.0.0", None, logging.WARNING, "SECURITY WARNING"),
        ("10.1.2.3", None, logging.WARNING, "SECURITY WARNING"),
        ("0.0.0.0", "k", logging.INFO, "auth on"),
    ],
)
def test_open_bind_without_key_warns(caplog, host, key, level, fragment):
    with caplog.at_level(logging.INFO, logger="onepass.server"):
        warn_if_open(ServerSettings(host=host, api_key=key))
    (record,) = [r for r in caplog.records if r.name == "onepass.server"]
    assert record.levelno == level and fragment in record.getMessage()
