"""One entry point, one dispatch table: ``onepass <command> …``.

Each command lives in ``onepass/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Commands import their heavy dependencies
inside ``run`` so ``onepass --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

COMMANDS = {
    "decide": "onepass.commands.decide",
    "serve": "onepass.commands.serve",
    "decide-schema": "onepass.commands.decide_schema",
    "train": "onepass.commands.train",
    "eval": "onepass.commands.eval",
    "merge": "onepass.commands.merge",
    "quantize": "onepass.commands.quantize",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onepass", description="Typed decisions from one forward pass of a language model."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
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
