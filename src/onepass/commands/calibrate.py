"""Fit a calibration from labelled Jev-native records and write calibration.json.

The model answers every record (with --debias as it will be served); then a per-question
correction is fitted (see onepass.calibration: content-free prior correction, a fitted
temperature + bias, both, or a full matrix on the log-probabilities; --method auto keeps the one
with the lowest negative log-likelihood on a held-out 30%). --target-error also fits an
abstention threshold on the held-out part: the lowest top probability whose answered questions
err at most that often. Serve, decide and eval apply the file with --calibration; it is
refused for another model, dtype, adapter or prompt version.

  onepass calibrate --dataset val.jsonl --output calibration.json --target-error 0.1
"""

from __future__ import annotations

import argparse
import sys

from onepass.calibration import METHODS
from onepass.commands.common import add_model_arguments, engine_from_args, probability

HELP = "fit a calibration (prior correction, temperature, abstention) on labelled records"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True,
                        help="Jev-native dataset (.jsonl, .json record or array)")
    parser.add_argument("--output", required=True, help="the calibration file to write")
    parser.add_argument("--method", default="auto", choices=["auto", *METHODS],
                        help="auto (default): the lowest held-out NLL of them all")
    parser.add_argument("--target-error", type=probability,
                        help="fit --abstain-below for this error rate on answered questions")
    parser.add_argument("--limit", type=int, help="use only the first N records")
    parser.add_argument("--seed", type=int, default=0, help="held-out split seed (default 0)")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from onepass import calibration as C
    from onepass.train.dataset import DatasetError, load_dataset

    console = Console(stderr=True)
    if args.calibration:
        print("onepass calibrate: --calibration applies a file; this command writes one",
              file=sys.stderr)
        return 2
    try:
        records = load_dataset(args.dataset)
    except DatasetError as exc:
        print(f"onepass calibrate: {exc}", file=sys.stderr)
        return 2
    records = records[: args.limit] if args.limit else records
    with console.status("loading model…"):
        engine = engine_from_args(args)
    with Progress(TextColumn("[bold]answering"), BarColumn(), MofNCompleteColumn(),
                  console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("answer", total=len(records))
        samples = C.collect(engine, records,
                            on_record=lambda done: progress.update(task, completed=done))
    if len(samples) < 10:
        print(f"onepass calibrate: {len(samples)} scored questions; at least 10 are needed",
              file=sys.stderr)
        return 2
    with console.status("content-free prior…"):
        prior = C.content_free_bias(engine, [s.question for s in samples])
    identity = engine.identity()
    best, table = C.choose(samples, identity, content_free=prior, debias=engine.debias,
                           seed=args.seed)
    method = best if args.method == "auto" else args.method
    calibration = C.fit(samples, method, identity, content_free=prior, debias=engine.debias)
    report = {"records": len(records), "questions": len(samples), "seed": args.seed,
              "held_out": table, "chosen": method}
    if args.target_error is not None:
        train, held = C.split(samples, 0.7, args.seed)
        part = C.fit(train, method, identity, content_free=prior, debias=engine.debias)
        threshold, curve = C.fit_abstention(held, part, args.target_error)
        calibration.abstain_below = threshold
        report["abstention"] = {"target_error": args.target_error, "threshold": threshold,
                                "curve": curve}
    calibration.report = report
    calibration.save(args.output)
    console.print(f"{len(samples)} questions; held-out (30%, seed {args.seed}) per method:")
    for name, row in table.items():
        mark = " <- written" if name == method else ""
        console.print(f"  {name:>12}: accuracy {row['accuracy']:.3f}  NLL {row['nll']:.3f}  "
                      f"Brier {row['brier']:.3f}  ECE {row['ece']:.3f}{mark}")
    if args.target_error is not None:
        threshold = calibration.abstain_below
        if threshold is None:
            console.print(f"no threshold reaches error <= {args.target_error} on held-out data")
        else:
            point = next(c for c in report["abstention"]["curve"] if c["threshold"] == threshold)
            console.print(f"abstain below {threshold:.3f}: coverage {point['coverage']:.2f}, "
                          f"error {point['error']:.3f} on held-out data")
    console.print(f"wrote {args.output}")
    return 0
