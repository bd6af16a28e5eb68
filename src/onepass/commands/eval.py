"""Evaluate a model (optionally with an adapter) on a Jev-native dataset (state + questions
with gold answers), answering through the same engine path the server uses.

Reports accuracy per question and overall, the multi-class Brier score, the expected
calibration error (10 equal-width bins of the top-label probability), confusion matrices for
noul/choice questions, mean absolute error for score questions, and throughput.

  onepass eval --dataset test.jsonl --adapter out/lora --output report.json --plot plots/

--output writes report.json (top-level accuracy, brier, ece, questions, per_question, ...);
--plot DIR writes reliability.png and report.md there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from onepass.commands.common import add_model_arguments, engine_from_args

HELP = "measure accuracy, Brier score and calibration on a labelled dataset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True,
                        help="Jev-native dataset (.jsonl, .json record or array)")
    parser.add_argument("--output", help="write the JSON report here")
    parser.add_argument("--plot", metavar="DIR",
                        help="write reliability.png and report.md into DIR (needs matplotlib)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N records")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from onepass.evaluate import (
        ECE_NOTE,
        LOW_LABEL_MASS,
        evaluate,
        markdown_report,
        reliability_diagram,
    )
    from onepass.train.dataset import DatasetError, load_dataset

    console = Console(stderr=True)
    try:
        records = load_dataset(args.dataset)
    except DatasetError as exc:
        print(f"onepass eval: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        records = records[: args.limit]
    with console.status("loading model…"):
        engine = engine_from_args(args)
    with Progress(
        TextColumn("[bold]evaluating"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("eval", total=len(records))
        report = evaluate(engine, records,
                          on_record=lambda done: progress.update(task, completed=done))
    report["dataset"] = str(args.dataset)
    report["adapter"] = args.adapter
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    if args.plot:
        folder = Path(args.plot)
        try:
            reliability_diagram({"overall": report["calibration_bins"]},
                                folder / "reliability.png",
                                f"{report['model']}: ECE {report['ece']:.3f} (10 bins)")
        except RuntimeError as exc:
            print(f"onepass eval: {exc}", file=sys.stderr)
            return 2
        (folder / "report.md").write_text(markdown_report(report, plot="reliability.png"))
    t = report["throughput"]
    console.print(
        f"accuracy {report['accuracy']:.3f}  Brier {report['brier']:.3f}  ECE {report['ece']:.3f}"
        f"  ({report['questions']} questions, {ECE_NOTE}; "
        f"{t['questions_per_second']:.2f} questions/s)"
    )
    for name, q in report["per_question"].items():
        extra = f"  MAE {q['mae']:.3f}" if "mae" in q else ""
        console.print(f"  {name}: accuracy {q['accuracy']:.3f}  Brier {q['brier']:.3f}  "
                      f"ECE {q['ece']:.3f}  n={q['n']}{extra}")
    health = report["label_health"]
    if health is not None:
        console.print(f"label health: median label mass {health['median_label_mass']:.3f} "
                      f"(lowest {health['min_label_mass']:.3f}); the model's own top token "
                      f"was a label in {health['argmax_is_label']:.0%} of answers")
        if health["low"]:
            console.print(f"[bold yellow]warning:[/] the median answer put less than "
                          f"{LOW_LABEL_MASS:.0%} of the model's probability on the option "
                          "labels: the readout is choosing between tokens the model did not "
                          "mean to say (try another prompt context, a larger model, or train "
                          "for the decision position)")
    return 0
