"""Answer a JSONL file of System One requests, one response per line.

Each input line is a request (an optional ``id`` is echoed). A bad line gets an error record
on its output line and the run goes on. A summary is printed at the end: ``cached_tokens`` sums
the lines' usage, which always includes the system prompt pinned at start-up
(``pinned_tokens`` per line); ``cache_hits`` counts only the lines that also reused a cached
state prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from onepass.commands.common import add_model_arguments, engine_from_args

HELP = "answer a JSONL file of System One requests"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input", required=True, help="JSONL file, one request per line (- for stdin)"
    )
    parser.add_argument("--output", required=True, help="JSONL file for responses (- for stdout)")
    add_model_arguments(parser)


def _error_record(line_no: int, request_id, exc: Exception) -> dict:
    from onepass.contract import ContractError

    if isinstance(exc, ContractError):
        error = {"message": str(exc), "type": exc.kind, "field": exc.field}
    elif isinstance(exc, json.JSONDecodeError):
        error = {
            "message": f"invalid JSON: {exc.msg} at column {exc.colno}",
            "type": "invalid_json",
        }
    else:
        error = {"message": f"{exc.__class__.__name__}: {exc}", "type": "internal_error"}
    record = {"line": line_no, "error": error}
    if request_id is not None:
        record = {"id": request_id, **record}
    return record


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    lines = (sys.stdin.read() if args.input == "-" else Path(args.input).read_text()).splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    with console.status("loading model…"):
        engine = engine_from_args(args)
    weights = getattr(engine.backend, "weight_bytes", None)
    if weights is not None:
        scheme = getattr(engine.backend, "quantization", None)
        console.print(f"model {engine.served_name}: {weights / 2**20:.1f} MiB of weights resident"
                      + (f" ({scheme})" if scheme else ""))
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    errors = tokens = cached = hits = 0
    pinned = engine.pinned_tokens
    start = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]deciding"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, disable=not console.is_terminal,
        ) as progress:
            task = progress.add_task("decide", total=len(numbered))
            for line_no, line in numbered:
                request_id = None
                try:
                    raw = json.loads(line)
                    if isinstance(raw, dict):
                        request_id = raw.get("id")
                    response = engine.answer(raw)
                    tokens += response["usage"]["input_tokens"]
                    cached += response["usage"]["cached_tokens"]
                    hits += response["usage"]["cached_tokens"] > pinned
                    record = {"id": request_id, **response} if request_id is not None else response
                except Exception as exc:  # every failure becomes this line's error record
                    errors += 1
                    record = _error_record(line_no, request_id, exc)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                progress.advance(task)
    finally:
        if out is not sys.stdout:
            out.close()
    seconds = time.perf_counter() - start
    console.print(
        f"lines={len(numbered)} errors={errors} input_tokens={tokens} cached_tokens={cached} "
        f"pinned_tokens={pinned} cache_hits={hits} seconds={seconds:.2f}",
        soft_wrap=True,  # one line whatever the width: scripts read it
    )
    return 1 if errors and errors == len(numbered) else 0
