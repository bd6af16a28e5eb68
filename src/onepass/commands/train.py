"""Train a model on the decision position the server reads (restricted cross-entropy over the
candidate labels at the last prompt position), rendered by the engine's own prompt code.

Methods: lora (peft adapters over a frozen base), qlora (adapters over an int4/int8/fp8/fp4 base
dequantized per layer on the fly), full (every parameter), from-scratch (random init over an
explicit geometry and a tokenizer, deterministic from --seed).

Every flag can also come from a TOML file (--configuration-file) with sections [run], [model],
[initialization], [dataset], [tokenizer]; each key resolves as flag > TOML > default.

Outputs: lora/qlora write adapter.safetensors + adapter_config.json (serve with
`onepass serve --model BASE --adapter DIR`, or `onepass merge`); full/from-scratch write a
complete checkpoint (model.safetensors, config.json, tokenizer files) for `--model DIR`.

Example:
  onepass train --method lora --dataset train.jsonl --validation-split 0.1 \\
      --output-directory out/lora --epochs 2 --batch-size 8 --learning-rate 5e-4
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HELP = "train lora / qlora / full / from-scratch on the served decision position"

ALIASES = {"model": ["--model-id"], "tokenizer": ["--tokenizer-file"]}
GROUPS = {
    "run": "run",
    "model": "geometry (from-scratch; TOML [model])",
    "dataset": "dataset",
    "tokenizer": "tokenizer",
}


def _list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from onepass.train.config import settings

    parser.add_argument("--configuration-file", metavar="TOML",
                        help="TOML file with [run], [model], [initialization], [dataset], "
                        "[tokenizer]; flags override its keys")
    groups = {name: parser.add_argument_group(title) for name, title in GROUPS.items()}
    for s in settings():
        if s.flag is None:
            continue
        names = [f"--{s.flag}", *ALIASES.get(s.flag, [])]
        default = ",".join(s.default) if isinstance(s.default, list) else s.default
        help_text = f"{s.help} (default: {default}; TOML [{s.section}] {s.key})"
        kwargs: dict = {"dest": s.dest, "default": None, "help": help_text}
        if s.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif s.type is list:
            kwargs["type"] = _list
            kwargs["metavar"] = "A,B,…"
        else:
            kwargs["type"] = s.type
            kwargs["metavar"] = s.key.upper()
            if s.choices:
                kwargs["choices"] = s.choices
        groups[s.section].add_argument(*names, **kwargs)


def flags_from_args(args: argparse.Namespace) -> dict[tuple[str, str], object]:
    from onepass.train.config import settings

    return {(s.section, s.key): getattr(args, s.dest, None) for s in settings() if s.flag}


def post_training_quantize(config: Any, *, show_progress: bool = False) -> Path | None:
    """``quantization_mode = "post-training"`` (typed-lm's key): quantize what was just
    trained — an adapter merged into its base, or a full / from-scratch checkpoint — exactly as
    ``onepass quantize`` would, into ``OUTPUT_DIRECTORY/quantized``. None when there is nothing
    to do (mode ``training``, or quantization ``none``)."""
    run = config.run
    if run.quantization_mode != "post-training" or run.quantization == "none":
        return None
    from onepass.adapters import AdapterError
    from onepass.commands.quantize import quantize
    from onepass.quant.artifact import QuantizeError
    from onepass.train.config import ConfigError

    out = Path(run.output_directory)
    adapters = run.method in ("lora", "qlora")
    try:
        quantize(run.model if adapters else str(out), str(out) if adapters else None,
                 run.quantization, out / "quantized", show_progress=show_progress)
    except (AdapterError, QuantizeError) as exc:
        raise ConfigError(f"post-training quantization: {exc}") from None
    return out / "quantized"


def prefer_passive_openmp() -> None:
    """Before torch loads: idle OpenMP workers sleep instead of spinning.

    On a small machine shared with other jobs, spinning workers made torch ~10x slower
    (measured on 2 cores under load); sleeping ones cost nothing measurable when idle.
    An explicit OMP_WAIT_POLICY in the environment wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run(args: argparse.Namespace) -> int:
    prefer_passive_openmp()
    from rich.console import Console

    from onepass.models import ModelError
    from onepass.train.config import ConfigError, resolve_config
    from onepass.train.dataset import DatasetError

    console = Console(stderr=True)
    try:
        config = resolve_config(flags_from_args(args), args.configuration_file)
        from onepass.train.loop import train

        result = train(config, console=console, show_progress=console.is_terminal)
        quantized = post_training_quantize(config, show_progress=console.is_terminal)
    except (ConfigError, DatasetError, ModelError, FileNotFoundError) as exc:
        print(f"onepass train: {exc}", file=sys.stderr)
        return 2
    if quantized is not None:
        console.print(f"quantized ({config.run.quantization}): {quantized}")
    best = result.history[result.best_epoch - 1] if result.best_epoch else {}
    if "validation_accuracy" in best:
        console.print(
            f"best epoch {result.best_epoch}: validation loss {best['validation_loss']:.4f}, "
            f"accuracy {best['validation_accuracy']:.3f}"
        )
    return 0
