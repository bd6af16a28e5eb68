"""Run the public evaluations on one model and write bench/REPORT.md, report.json and plots.

CLINC150 10-domain routing, a fixed 10-intent BANKING77 subset and CLINC150 domain membership as
a yes/no question: accuracy, Brier, ECE and reliability diagrams for zero-shot, --debias
name-order, rotations and rotations+content-free, a calibration fitted on other records, and
teach-by-example with K examples per option; the option-permutation flip rate; JevBench's
frozen mini suite (--domains) against the HTTP app served in this process; latency per request
(miss, hit), for every debias setting. Every number comes from this one run.

  onepass bench --output bench --limit 100 --teach 1,2,4
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from onepass.bench import DATASETS, DEBIAS_SETTINGS
from onepass.commands.common import (
    add_model_arguments,
    default_data_dir,
    engine_from_args,
    env_argument,
    non_negative_int,
    positive_int,
)

HELP = "benchmark quality (CLINC150, BANKING77, JevBench), calibration, flip rate and latency"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if any(v < 1 for v in values):
        values = []
    if not values and text.strip():
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _subset(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a non-empty comma-separated list of names from ``allowed``."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(
                f"expected comma-separated names from {', '.join(allowed)}, got {text!r}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="bench", help="folder for the report (default bench)")
    env_argument(parser, "--data-dir", default=None,
                 help="folder with clinc150/ and banking77/ (default: "
                 "$ONEPASS_SHARED_DIR/data, else ../shared/data, else the subsets packaged "
                 "with onepass)")
    parser.add_argument("--limit", type=positive_int, default=100,
                        help="scored test records per dataset (default 100)")
    parser.add_argument("--fit-limit", type=positive_int, default=100,
                        help="records per dataset the calibration is fitted on (default 100)")
    parser.add_argument("--teach", type=_ints, default=[1, 2, 4],
                        help="examples per option to teach with, comma-separated (default "
                        "1,2,4; empty: none)")
    parser.add_argument("--flip-records", type=non_negative_int, default=40,
                        help="records for the permutation flip rate (default 40)")
    parser.add_argument("--latency-requests", type=positive_int, default=10,
                        help="requests timed per setting (default 10)")
    parser.add_argument("--domains", default="customer_support,ecommerce_returns",
                        help="JevBench mini domains, comma-separated; 'none' skips JevBench")
    parser.add_argument("--datasets", type=_subset(DATASETS), default=list(DATASETS),
                        help="comma-separated, the first also gives the flip rate and latency "
                        f"(default {','.join(DATASETS)})")
    parser.add_argument("--debias-settings", type=_subset(DEBIAS_SETTINGS),
                        default=list(DEBIAS_SETTINGS),
                        help="the readings compared, comma-separated (default "
                        f"{','.join(DEBIAS_SETTINGS)})")
    parser.add_argument("--seed", type=int, default=0, help="record selection (default 0)")
    parser.add_argument("--names-only", action="store_true",
                        help="CLINC150 options by name, without their descriptions (a third "
                        "of the prompt: rotations read K suffixes)")
    add_model_arguments(parser)


def missing_modules(names: list[str]) -> list[str]:
    """The modules of ``names`` that cannot be imported here (an extra not installed)."""
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from onepass.bench import BenchConfig
    from onepass.bench import run as bench

    console = Console(stderr=True)
    domains = None if args.domains.strip().lower() in ("", "none") else [
        d.strip() for d in args.domains.split(",") if d.strip()]
    config = BenchConfig(
        data_dir=Path(args.data_dir) if args.data_dir else default_data_dir(),
        output=Path(args.output),
        limit=args.limit, fit_limit=args.fit_limit, teach=args.teach,
        flip_records=args.flip_records, latency_requests=args.latency_requests,
        domains=domains, seed=args.seed, describe=not args.names_only, datasets=args.datasets,
        debias_settings=args.debias_settings,
        settings={"model": args.model, "dtype": args.dtype, "adapter": args.adapter,
                  "context_path": args.context_path},
    )
    if not (config.data_dir / "clinc150").is_dir():
        console.print(f"onepass bench: no datasets at {config.data_dir} (--data-dir)")
        return 2
    missing = missing_modules(["jevbench", "uvicorn", "fastapi"]) if domains else []
    if missing:  # JevBench runs last: say so before the model loads and minutes of scoring
        console.print(f"onepass bench: JevBench needs {', '.join(missing)}: pip install "
                      "'onepass[bench]' (or --domains none to skip it)")
        return 2
    with console.status("loading model…"):
        engine = engine_from_args(args)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        tasks: dict[str, int] = {}

        def tick(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        report = bench(engine, config, tick)
    console.print((config.output / "REPORT.md").read_text())
    console.print(f"wrote {config.output}/REPORT.md, report.json and the reliability diagrams")
    return 0 if report else 1
