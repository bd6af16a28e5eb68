"""Generate text from the same resident model the decisions use, streamed to the terminal.

    onepass generate "Write a haiku about the sea."
    echo "Summarise: ..." | onepass generate --system "Be brief." --temperature 0
    onepass generate "A user record." --json-schema '{"type": "object", ...}'
    onepass generate "Yes or no?" --grammar answer.lark

The prompt is sent as one user message through the model's chat template. Sampling flags take
the OpenAI names and ranges (validated; nothing is clamped); --temperature 0 is greedy. The
text goes to stdout as it is generated; a one-line summary (finish reason, token usage, speed)
goes to stderr.

--json-schema (a file or inline JSON) and --grammar (a Lark or GBNF file) constrain every token
through the grammar engine, so a run that finishes with "stop" always parses; a schema or
grammar the engine cannot enforce is refused before the model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from onepass.commands.common import add_model_arguments, engine_from_args

HELP = "generate text (chat) from the model, streamed to the terminal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", help="the user message (default: read stdin)")
    g = parser.add_argument_group("generation")
    g.add_argument("--system", help="a system message before the prompt")
    g.add_argument("--max-tokens", type=int, help="output limit (default: the model's "
                   "default, capped by the context left)")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature in [0, 2] (default 1.0; 0 = greedy)")
    g.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--min-p", type=float, help="drop tokens under min_p x the top one's p")
    g.add_argument("--typical-p", type=float, help="locally typical sampling mass in (0, 1]")
    g.add_argument("--presence-penalty", type=float, help="in [-2, 2]")
    g.add_argument("--frequency-penalty", type=float, help="in [-2, 2]")
    g.add_argument("--repetition-penalty", type=float, help="> 0 (1 = off)")
    g.add_argument("--stop", action="append", help="a stop string (repeatable, at most 4)")
    g.add_argument("--seed", type=int, help="seed of this request's sampler")
    c = parser.add_argument_group("structured output (one of)")
    x = c.add_mutually_exclusive_group()
    x.add_argument("--json-schema", metavar="FILE|JSON",
                   help="constrain the output to this JSON Schema (a file, or the JSON inline)")
    x.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark or "
                   "GBNF grammar (a file)")
    add_model_arguments(parser, readout=False)


def run(args: argparse.Namespace) -> int:
    from onepass.contract import ContractError

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        raise SystemExit("onepass generate: the prompt is empty (give it as an argument or "
                         "on stdin)")
    sampling: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "stop", "seed")
        if getattr(args, name) is not None
    }
    from onepass.generate.sampling import SamplingParams

    try:  # refuse bad sampling flags before spending seconds on loading the model
        SamplingParams.from_request({**sampling, "max_tokens": args.max_tokens})
        constraint = _constraint(args)
    except ContractError as exc:
        print(f"onepass generate: --{exc.field.replace('_', '-')}: {exc.message}",
              file=sys.stderr)
        return 2
    engine = engine_from_args(args, readout=False)
    start = time.perf_counter()
    try:
        chunks = engine.stream(prompt, system=args.system, max_tokens=args.max_tokens,
                               **constraint, **sampling)
        first = None
        for text in chunks:
            first = first or time.perf_counter()
            sys.stdout.write(text)
            sys.stdout.flush()
    except ContractError as exc:  # the prompt does not fit, or the engine refused the schema
        where = {"response_format.json_schema.schema": "--json-schema",
                 "grammar": "--grammar"}.get(exc.field, exc.field)
        print(f"onepass generate: {where}: {exc.message}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    last = chunks.finish
    elapsed = time.perf_counter() - start
    if last is not None:
        rate = last.completion_tokens / max(elapsed - ((first or start) - start), 1e-9)
        print(f"[finish={last.reason} prompt_tokens={last.prompt_tokens} "
              f"completion_tokens={last.completion_tokens} cached_tokens={last.cached_tokens} "
              f"first_token_s={(first or start) - start:.2f} tokens_per_s={rate:.1f}]",
              file=sys.stderr)
    return 0


def _constraint(args: argparse.Namespace) -> dict[str, Any]:
    """--json-schema / --grammar as engine.stream keywords (read and parsed, not compiled:
    compiling needs the model's vocabulary)."""
    from onepass.contract import ContractError

    if args.grammar is not None:
        path = Path(args.grammar)
        if not path.is_file():
            raise ContractError("grammar", f"no such file: {path}")
        return {"grammar": path.read_text(encoding="utf-8")}
    if args.json_schema is None:
        return {}
    raw = args.json_schema
    path = Path(raw)
    if not raw.lstrip().startswith("{") and path.is_file():
        raw = path.read_text(encoding="utf-8")
    try:
        schema = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ContractError("json_schema", f"neither a file nor JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise ContractError("json_schema", "expected a JSON Schema object")
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "cli", "schema": schema}}}
