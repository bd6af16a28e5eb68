"""Write K labelled examples per option from a Jev-native dataset as a system context.

Serve it with --context-path: the examples are prefilled once at start-up and pinned, so they
cost nothing per request (each request's cached_tokens includes them). Answers are written by
option name, so they stay right under any option order and with --debias rotations.

  onepass teach --dataset train.jsonl --output context.md --per-label 2
  onepass serve --context-path context.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onepass.commands.common import positive_int

HELP = "write K labelled examples per option as a pinned system context (teach by example)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True,
                        help="Jev-native dataset (.jsonl, .json record or array) with answers")
    parser.add_argument("--output", required=True, help="the context file to write (Markdown)")
    parser.add_argument("--per-label", type=positive_int, default=2,
                        help="examples per option (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="which examples (default 0)")


def run(args: argparse.Namespace) -> int:
    from onepass.teach import parse_context, render_context, select_examples
    from onepass.train.dataset import DatasetError, load_dataset

    try:
        records = load_dataset(args.dataset)
    except DatasetError as exc:
        print(f"onepass teach: {exc}", file=sys.stderr)
        return 2
    examples = select_examples(records, args.per_label, args.seed)
    text = render_context(examples)
    assert parse_context(text) == examples  # what is served reads back as what was chosen
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text, encoding="utf-8")
    for question, pairs in examples.items():
        answers = {a for _, a in pairs}
        print(f"{question}: {len(pairs)} examples over {len(answers)} answers", file=sys.stderr)
    print(f"wrote {args.output} ({len(text)} characters); serve it with --context-path",
          file=sys.stderr)
    return 0
