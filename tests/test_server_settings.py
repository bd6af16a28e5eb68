"""`onepass serve` configuration: every flag documented, flag > ONEPASS_<FLAG> > default,
bad values refused, and the warning for an open, unauthenticated bind."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("fastapi")

from onepass.cli import build_parser  # noqa: E402
from onepass.commands.serve import settings_from_args, warn_if_open  # noqa: E402
from onepass.server.settings import ServerSettings  # noqa: E402

SERVER_FLAGS = ["--host", "--port", "--api-key", "--max-body-bytes", "--max-questions",
                "--max-queue", "--request-deadline", "--workers", "--threads",
                "--drain-seconds", "--log-level"]
MODEL_FLAGS = ["--model", "--served-model-name", "--device", "--dtype", "--context-path",
               "--session-cache-entries", "--session-cache-tokens", "--max-input-tokens"]


def parse(argv: list[str]):
    return build_parser().parse_args(["serve", *argv])


def serve_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"].format_help()


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


def test_bad_values_are_refused(monkeypatch):
    monkeypatch.setenv("ONEPASS_PORT", "eighty")
    with pytest.raises(SystemExit, match="ONEPASS_PORT"):
        parse([])
    monkeypatch.delenv("ONEPASS_PORT")
    with pytest.raises(SystemExit, match="max_queue"):
        settings_from_args(parse(["--max-queue", "0"]))
    with pytest.raises(ValueError, match="api_key"):
        ServerSettings(api_key="two words")


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
