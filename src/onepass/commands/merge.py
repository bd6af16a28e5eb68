"""Merge a LoRA adapter (from `onepass train --method lora|qlora`) into its base model and
write a complete checkpoint directory (model.safetensors, config.json, tokenizer files) that
`onepass serve --model DIR` serves directly, with no adapter step at load.

  onepass merge --model smollm2-135m-instruct --adapter out/lora --output-directory out/merged
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "merge a LoRA adapter into its base and write a servable checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "--model-id", help="base model: embedded alias (default: "
                        "smollm2-135m-instruct), .gguf, checkpoint directory or hub id")
    parser.add_argument("--adapter", "--adapter-directory", required=True,
                        help="adapter directory")
    parser.add_argument("--output-directory", required=True, help="where to write")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the written weights (default float32)")


def load_merged(resolved: Any, adapter: str | None) -> tuple[Any, Any]:
    """The resolved base in float32 with ``adapter`` merged (when given), and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from onepass.adapters import apply_adapter
    from onepass.models import check_family

    check_family(resolved.path / "config.json")
    base = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    if adapter is not None:
        base = apply_adapter(base, adapter)
    return base, tokenizer


def merge(model: str | None, adapter: str, output_directory: str, dtype: str = "float32") -> None:
    """Load the base, merge the adapter, save the merged checkpoint."""
    import torch

    from onepass import option_order
    from onepass.calibration import Calibration
    from onepass.models import resolve
    from onepass.train.artifacts import write_checkpoint

    merged, tokenizer = load_merged(resolve(model), adapter)
    write_checkpoint(output_directory, merged.to(getattr(torch, dtype)), tokenizer)
    Calibration.carry_bundled(adapter, output_directory)  # the adapter's own, if it has one
    option_order.carry(adapter, output_directory)  # and the option order it was trained in


def run(args: argparse.Namespace) -> int:
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from onepass.adapters import AdapterError
    from onepass.models import ModelError

    try:
        merge(args.model, args.adapter, args.output_directory, args.dtype)
    except (AdapterError, ModelError) as exc:
        print(f"onepass merge: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_directory}", file=sys.stderr)
    return 0
