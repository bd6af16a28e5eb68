"""One entry point, one dispatch table: ``onepass <command> …``.

Each command lives in ``onepass/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Commands import their heavy dependencies
inside ``run`` so ``onepass --help`` stays instant. They are imported plainly: a command that
fails to import is a bug to see, never a command that silently disappears.
"""

from __future__ import annotations

import argparse
import sys

from onepass.commands import (
    bench,
    calibrate,
    decide,
    decide_schema,
    generate,
    merge,
    pull,
    quantize,
    serve,
    teach,
    train,
)
from onepass.commands import eval as evaluate
from onepass.commands.common import CommandParser

COMMANDS = {
    "decide": decide,
    "serve": serve,
    "decide-schema": decide_schema,
    "generate": generate,
    "train": train,
    "eval": evaluate,
    "calibrate": calibrate,
    "teach": teach,
    "bench": bench,
    "merge": merge,
    "pull": pull,
    "quantize": quantize,
}


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="onepass", description="Typed decisions from one forward pass of a language model."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
