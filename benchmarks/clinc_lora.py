"""CLINC150 10-domain routing: the embedded model zero-shot vs the same model with a LoRA
adapter trained by `onepass train`, on a held-out test split.

    python benchmarks/clinc_lora.py [--train 300] [--test 200] [--epochs 2] ...

Steps (all through the public pieces: datasets, train loop, engine, evaluate):

1. fixed splits from ../shared/data/clinc150: N train records from the upstream train split,
   a validation set from upstream val, M test records from upstream test (stratified, seeded);
2. zero-shot: the base engine answers the test split (accuracy, Brier, ECE);
3. LoRA: train on the train split with per-epoch validation, keep the best epoch;
4. the base + adapter engine (merged at load, as `onepass serve --adapter` does) answers the
   same test split, with the calibration the trainer fitted on the validation split (the
   default) and without it;
5. writes results.json, report.md, reliability.png (both models), loss.png and the
   confusion matrices into --output-directory, and prints the comparison.

A benchmark prints numbers; it asserts nothing (tests/test_train_learning.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--output-directory", default=str(ROOT / "runs" / "clinc_lora"),
                   help="default runs/clinc_lora (git-ignored: it holds data-derived files)")
    p.add_argument("--train", type=int, default=500, help="training records (default 500)")
    p.add_argument("--validation", type=int, default=50, help="validation records (default 50)")
    p.add_argument("--test", type=int, default=200, help="held-out test records (default 200)")
    p.add_argument("--no-descriptions", action="store_true",
                   help="options by name only (shorter prompts) instead of with descriptions")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--lr-schedule", default="constant", choices=["linear", "cosine", "constant"])
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-layers", type=int, default=8,
                   help="adapt the last N layers (0: all; default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from onepass.datasets import clinc150_domain_routing, write_jsonl
    from onepass.engine import DecisionEngine
    from onepass.evaluate import (
        ECE_NOTE,
        evaluate,
        markdown_report,
        reliability_diagram,
    )
    from onepass.train.config import resolve_config
    from onepass.train.dataset import load_dataset
    from onepass.train.loop import train

    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    out = Path(args.output_directory)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data_dir)

    def records(split: str, n: int) -> list[dict]:
        rows = clinc150_domain_routing(data, split, n, args.seed)
        if args.no_descriptions:
            for r in rows:
                q = r["questions"]["domain"]
                q["criteria"] = dict.fromkeys(q["criteria"])
        return rows

    paths = {}
    for name, split, n in (("train", "train", args.train), ("validation", "val", args.validation),
                           ("test", "test", args.test)):
        paths[name] = out / f"{name}.jsonl"
        write_jsonl(records(split, n), paths[name])
    test = load_dataset(paths["test"])

    def run_eval(engine, label: str) -> dict:
        with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                      console=console) as progress:
            task = progress.add_task(label, total=len(test))
            return evaluate(engine, test, on_record=lambda i: progress.update(task, completed=i))

    started = time.perf_counter()
    with console.status("loading the base model…"):
        base = DecisionEngine.from_pretrained()
    zero = run_eval(base, "zero-shot")
    console.print(f"zero-shot: accuracy {zero['accuracy']:.3f}, ECE {zero['ece']:.3f}")
    del base

    adapter_dir = out / "adapter"
    config = resolve_config({
        ("run", "method"): "lora", ("run", "output_directory"): str(adapter_dir),
        ("dataset", "path"): str(paths["train"]),
        ("dataset", "validation_path"): str(paths["validation"]),
        ("run", "epochs"): args.epochs, ("run", "batch_size"): args.batch_size,
        ("run", "learning_rate"): args.learning_rate, ("run", "lora_rank"): args.lora_rank,
        ("run", "lora_alpha"): args.lora_alpha, ("run", "lora_layers"): args.lora_layers,
        ("run", "warmup_steps"): 10, ("run", "seed"): args.seed,
        ("run", "lr_schedule"): args.lr_schedule,
    })
    result = train(config, console=console, show_progress=console.is_terminal)
    with console.status("loading base + adapter…"):
        tuned_engine = DecisionEngine.from_pretrained(adapter=adapter_dir)
    tuned = run_eval(tuned_engine, "LoRA")  # with the adapter's own calibration (the default)
    console.print(f"LoRA: accuracy {tuned['accuracy']:.3f}, ECE {tuned['ece']:.3f}")
    tuned_engine.set_calibration(None)  # what it served before the trainer fitted one
    raw = run_eval(tuned_engine, "LoRA, uncalibrated")
    console.print(f"LoRA uncalibrated: accuracy {raw['accuracy']:.3f}, ECE {raw['ece']:.3f}")

    for name, report in (("zero_shot", zero), ("lora", tuned), ("lora_uncalibrated", raw)):
        report["dataset"] = str(paths["test"])
        (out / f"{name}_report.json").write_text(json.dumps(report, indent=2) + "\n")
    reliability_diagram({"zero-shot": zero["calibration_bins"],
                         "LoRA, uncalibrated": raw["calibration_bins"],
                         "LoRA": tuned["calibration_bins"]}, out / "reliability.png",
                        "CLINC150 domains, held-out test (10 equal-width bins)")
    _loss_plot(result.history, out / "loss.png")
    summary = {
        "task": "CLINC150 10-domain routing (choice)"
                + (", names only" if args.no_descriptions else ", with domain descriptions"),
        "train_records": args.train, "validation_records": args.validation,
        "test_records": args.test, "epochs_run": len(result.history),
        "best_epoch": result.best_epoch, "training_seconds": round(result.seconds, 1),
        "zero_shot": {k: zero[k] for k in ("accuracy", "brier", "ece")},
        "lora": {k: tuned[k] for k in ("accuracy", "brier", "ece")},
        "lora_uncalibrated": {k: raw[k] for k in ("accuracy", "brier", "ece")},
        "calibration": result_calibration(adapter_dir),
        "history": result.history, "settings": vars(args),
        "seconds": round(time.perf_counter() - started, 1), "ece_note": ECE_NOTE,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        "# CLINC150 domain routing: zero-shot vs LoRA", "",
        f"{summary['task']}; {args.train} train / {args.validation} validation / {args.test} "
        f"held-out test records; LoRA rank {args.lora_rank}, alpha {args.lora_alpha}, last "
        f"{args.lora_layers or 'all'} layers, {len(result.history)} epochs (best "
        f"{result.best_epoch}), lr {args.learning_rate} ({args.lr_schedule}, LoRA+ B ratio 16), "
        f"batch {args.batch_size}; training "
        f"{result.seconds:.0f} s on this machine.", "",
        "| model | accuracy | Brier | ECE |", "|---|---|---|---|",
        f"| zero-shot | {zero['accuracy']:.3f} | {zero['brier']:.3f} | {zero['ece']:.3f} |",
        f"| LoRA, uncalibrated | {raw['accuracy']:.3f} | {raw['brier']:.3f} | "
        f"{raw['ece']:.3f} |",
        f"| LoRA (its calibration.json, the default) | {tuned['accuracy']:.3f} | "
        f"{tuned['brier']:.3f} | {tuned['ece']:.3f} |", "",
        f"{ECE_NOTE}.", "", "![reliability](reliability.png) ![loss](loss.png)", "",
        "## LoRA details", "", markdown_report(tuned).split("\n", 2)[2],
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    console.print(json.dumps({k: summary[k] for k in ("zero_shot", "lora_uncalibrated", "lora",
                                                        "calibration", "training_seconds",
                                                        "seconds")}, indent=2))
    print(f"wrote {out}")
    return 0


def result_calibration(adapter_dir: Path) -> dict | None:
    """The temperatures the trainer fitted on the validation split (None: it fitted none)."""
    path = adapter_dir / "calibration.json"
    return json.loads(path.read_text())["report"] if path.exists() else None


def _loss_plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    if history and "validation_loss" in history[0]:
        ax.plot(epochs, [h["validation_loss"] for h in history], marker="o", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("restricted cross-entropy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
