"""Post-training quantization: merge an optional LoRA adapter, then write the decoder's linear
weights as FP8 (E4M3, per-output-channel scales), MXFP4 (E2M1 + one E8M0 exponent per 32
weights) or int8 (per-output-channel scales), and the token embedding / output head in
bfloat16 (or int8 per row, `--embedding`). OUT is complete (weights, quantization_config.json,
config, tokenizer): serve it with `onepass serve --model OUT`. At load each layer becomes
working weights once (`--compute`, recorded in OUT): auto = the model's float dtype decoded
once (bfloat16 on a CPU with bf16 units), `int8` (PyTorch's dynamic int8 kernel on VNNI: fast,
but it quantizes activations too and moves answers more), or `stored` (kept as written,
decoded per forward: least memory, slowest). `--quantization none` performs only the merge.

  onepass quantize --adapter out/lora --quantization fp4 --output-directory out/fp4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "merge an adapter and write FP8 / MXFP4 / int8 weights that onepass serve loads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="base model: embedded alias (default: "
                        "smollm2-135m-instruct), .gguf, checkpoint directory or hub id")
    parser.add_argument("--adapter", help="LoRA adapter directory merged before quantizing")
    parser.add_argument("--quantization", required=True, choices=["fp8", "fp4", "int8", "none"],
                        help="fp8 (E4M3), fp4 (MXFP4), int8 (per channel) or none (merge only)")
    parser.add_argument("--output-directory", required=True, help="where to write")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the tensors left in high precision (norms, biases; "
                        "default float32)")
    parser.add_argument("--embedding", default="bfloat16", choices=["bfloat16", "int8", "float32"],
                        help="how the token embedding / output head is stored (default "
                        "bfloat16; int8: one scale per row)")
    parser.add_argument("--compute", default="auto",
                        choices=["auto", "int8", "bfloat16", "float32", "float16", "stored"],
                        help="working weights a load builds once (default auto: the model's "
                        "dtype; int8: VNNI kernel; stored: decode every forward)")


def quantize(
    model: str | None,
    adapter: str | None,
    scheme: str,
    output_directory: str | Path,
    dtype: str = "float32",
    show_progress: bool = False,
    *,
    embedding: str = "bfloat16",
    compute: str = "auto",
) -> dict[str, Any]:
    """Merge, quantize and write OUT; returns its quantization_config.json."""
    import torch

    from onepass import __version__
    from onepass.commands.merge import load_merged
    from onepass.models import resolve
    from onepass.prompt import PROMPT_VERSION
    from onepass.quant.artifact import (
        FORMAT,
        QUANT_CONFIG,
        QuantizeError,
        refuse_quantized_input,
        write_quantized,
    )
    from onepass.quant.linear import decoder_linears
    from onepass.train.artifacts import write_checkpoint

    resolved = resolve(model)
    out = Path(output_directory)
    if out.resolve() == resolved.path.resolve():
        raise QuantizeError(f"--output-directory {out} is the input checkpoint: choose another")
    refuse_quantized_input(resolved.path)
    merged, tokenizer = load_merged(resolved, adapter)
    provenance = {"base": resolved.source, "adapter": str(adapter) if adapter else None,
                  "prompt_version": PROMPT_VERSION, "onepass_version": __version__}
    torch_dtype = getattr(torch, dtype)
    if scheme == "none":
        write_checkpoint(out, merged.to(torch_dtype), tokenizer)
        config = {"format": FORMAT, "scheme": "none", **provenance}
        (out / QUANT_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        return config

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("quantize {task.description}"), BarColumn(), MofNCompleteColumn(),
                  disable=not show_progress) as progress:
        task = progress.add_task(scheme, total=len(decoder_linears(merged)))
        config = write_quantized(merged, tokenizer, out, scheme, dtype=torch_dtype,
                                 embedding=embedding, compute=compute, provenance=provenance,
                                 progress=lambda: progress.advance(task))
    return config


def run(args: argparse.Namespace) -> int:
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from onepass.adapters import AdapterError
    from onepass.models import ModelError
    from onepass.quant.artifact import WEIGHTS, QuantizeError

    try:
        config = quantize(args.model, args.adapter, args.quantization, args.output_directory,
                          args.dtype, show_progress=sys.stderr.isatty(),
                          embedding=args.embedding, compute=args.compute)
    except (AdapterError, ModelError, QuantizeError) as exc:
        print(f"onepass quantize: {exc}", file=sys.stderr)
        return 2
    size = (Path(args.output_directory) / WEIGHTS).stat().st_size
    layers = len(config.get("quantized_layers", []))
    print(f"wrote {args.output_directory} ({config['scheme']}: {layers} linear layers "
          f"quantized, {WEIGHTS} {size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0
