"""Post-training quantization: merge an optional LoRA adapter, then write the decoder's linear
weights as FP8 (E4M3, per-output-channel scales), MXFP4 (E2M1 + one E8M0 exponent per 32
weights) or int8 (per-output-channel scales), and the token embedding / output head in int8
with one scale per row for fp8/fp4, bfloat16 for int8 (`--embedding`). OUT is complete (weights,
quantization_config.json, config, tokenizer): serve it with `onepass serve --model OUT`. At
load each layer becomes working weights once (`--compute`, recorded in OUT): auto = the
model's float dtype decoded once (bfloat16 on a CPU with bf16 units), `int8` (int8 matmuls on
VNNI: fast, but it quantizes activations too, per token, and moves answers more), `fp8` (fp8
tensor cores of a CUDA GPU), or `stored` (kept as written, decoded per forward: least memory,
slowest). `--quantization none` performs only the merge.

fp4 is calibrated: GPTQ rounding (quant/calibrate.py) on real decision prompts rendered from
`--calibration-dataset` (default: the shipped CLINC150 / BANKING77 train splits; a JSONL file
of requests; `none`: plain round-to-nearest), `--calibration-samples` of them; `--keep-fp8`
keeps the named layers (or `auto[:K]`: the K with the largest measured output error) at fp8;
calibrated fp4 defaults to `auto` (16 layers, at most an eighth of them), `none` keeps none.
`--report` prints and writes (report.json, report.md in OUT) the per-layer error, the probe
agreement with the float model, sizes and latency.

  onepass quantize --adapter out/lora --quantization fp4 --output-directory out/fp4
  onepass quantize --quantization fp4 --keep-fp8 auto:4 --report --output-directory out/fp4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from onepass.commands.common import default_data_dir, positive_int

HELP = "merge an adapter and write FP8 / MXFP4 / int8 weights that onepass serve loads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "--model-id", help="base model: embedded alias (default: "
                        "smollm2-135m-instruct), .gguf, checkpoint directory or hub id")
    parser.add_argument("--adapter", "--adapter-directory",
                        help="LoRA adapter directory merged before quantizing")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                        help="accepted for typed-lm's scripts: quantizing runs on the CPU "
                        "(auto, cpu); cuda and mps are refused")
    parser.add_argument("--quantization", required=True, choices=["fp8", "fp4", "int8", "none"],
                        help="fp8 (E4M3), fp4 (MXFP4), int8 (per channel) or none (merge only)")
    parser.add_argument("--output-directory", required=True, help="where to write")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the tensors left in high precision (norms, biases; "
                        "default float32)")
    parser.add_argument("--embedding", default="auto",
                        choices=["auto", "int8", "bfloat16", "float32"],
                        help="how the token embedding / output head is stored (default auto: "
                        "int8 with one scale per row for fp8/fp4, bfloat16 for int8)")
    parser.add_argument("--compute", default="auto",
                        choices=["auto", "int8", "fp8", "bfloat16", "float32", "float16",
                                 "stored"],
                        help="working weights a load builds once (default auto: the model's "
                        "dtype; int8: VNNI kernel; fp8: a GPU's fp8 units; stored: decode every "
                        "forward)")
    parser.add_argument("--calibration-dataset", metavar="FILE|NAME",
                        help="prompts fp4's GPTQ rounding is calibrated on: shipped (default: "
                        "CLINC150 + BANKING77 train), clinc150, banking77, a JSONL file of "
                        "requests, or none (plain rounding)")
    parser.add_argument("--calibration-samples", metavar="N", type=positive_int, default=None,
                        help=f"calibration requests (default {DEFAULT_SAMPLES})")
    parser.add_argument("--keep-fp8", metavar="LAYERS",
                        help="fp4 only: keep these decoder linears at fp8 (comma list of "
                        "names, e.g. model.layers.0.mlp.down_proj), auto[:K] (the K where plain "
                        f"rounding's calibration error is largest; K default "
                        f"{DEFAULT_AUTO_KEEP}), or none; default when calibrating: auto, at "
                        "most an eighth of the layers")
    parser.add_argument("--report", action="store_true",
                        help="measure what was traded (per-layer error, probe agreement and "
                        "TV vs the float model, sizes, latency): print it, write report.json "
                        "and report.md in the output directory")
    parser.add_argument("--report-probes", metavar="N", type=positive_int, default=100,
                        help="probe requests the report answers (default 100)")
    parser.add_argument("--data-dir", default=None,
                        help="folder with clinc150/ and banking77/ (default: "
                        "$ONEPASS_SHARED_DIR/data, else ../shared/data, else the subsets "
                        "packaged with onepass)")


DEFAULT_SAMPLES = 32
DEFAULT_AUTO_KEEP = 16


def default_probes(data_dir: Path, limit: int = 100) -> list[dict[str, Any]]:
    """The probe requests: the hand-written cases (packaged, so a wheel install probes what a
    checkout does), then CLINC150 test records from ``data_dir``."""
    from onepass.datasets import HANDWRITTEN_PROBES, probe_requests

    return probe_requests(data_dir, HANDWRITTEN_PROBES)[:limit]


def quantize(
    model: str | None,
    adapter: str | None,
    scheme: str,
    output_directory: str | Path,
    dtype: str = "float32",
    show_progress: bool = False,
    *,
    embedding: str = "auto",
    compute: str = "auto",
    calibration_dataset: str | None = None,
    calibration_samples: int | None = None,
    keep_fp8: str | None = None,
    report: bool = False,
    report_probes: int = 100,
    data_dir: str | Path | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Merge, quantize and write OUT; returns its quantization_config.json (plus, with
    ``report``, the measured report under the key ``report``, also written to OUT).

    fp4 is GPTQ-calibrated on ``calibration_dataset`` (None: the shipped datasets when present,
    else plain rounding with a note in ``notes``; ``"none"``: plain rounding); ``keep_fp8``
    is the ``--keep-fp8`` text. Flag errors are QuantizeErrors naming the flag."""
    import torch

    from onepass import __version__, option_order
    from onepass.calibration import Calibration
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
    from onepass.quant.calibrate import CalibrationError
    from onepass.quant.linear import decoder_linears
    from onepass.train.artifacts import write_checkpoint

    data = Path(data_dir) if data_dir is not None else default_data_dir()
    explicit = calibration_dataset is not None or calibration_samples is not None
    if scheme != "fp4" and (explicit and calibration_dataset != "none" or keep_fp8):
        flag = "--keep-fp8" if keep_fp8 else "--calibration-dataset" \
            if calibration_dataset is not None else "--calibration-samples"
        raise QuantizeError(f"{flag} applies to --quantization fp4 only, not {scheme}")
    if calibration_samples is not None and calibration_samples < 1:
        raise QuantizeError(f"--calibration-samples: expected >= 1, got {calibration_samples}")
    if report and scheme == "none":
        raise QuantizeError("--report needs a quantized scheme, not none")
    if report and not (data / "clinc150").is_dir():
        raise QuantizeError(f"--report: the probe requests need the shipped datasets, not "
                            f"found at {data} (--data-dir)")
    resolved = resolve(model)
    out = Path(output_directory)
    if out.resolve() == resolved.path.resolve():
        raise QuantizeError(f"--output-directory {out} is the input checkpoint: choose another")
    refuse_quantized_input(resolved.path)
    merged, tokenizer = load_merged(resolved, adapter)
    # the trained weights' own calibration (the adapter's, or a trained checkpoint's) travels
    Calibration.carry_bundled(adapter or resolved.path, out)
    option_order.carry(adapter or resolved.path, out)  # and the option order they read
    provenance = {"base": resolved.source, "adapter": str(adapter) if adapter else None,
                  "prompt_version": PROMPT_VERSION, "onepass_version": __version__}
    torch_dtype = getattr(torch, dtype)
    if scheme == "none":
        write_checkpoint(out, merged.to(torch_dtype), tokenizer)
        config = {"format": FORMAT, "scheme": "none", **provenance}
        (out / QUANT_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        return config

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from onepass.quant import calibrate as cal

    names = [name for name, _ in decoder_linears(merged)]
    try:
        kept, auto_keep = cal.parse_keep_fp8(keep_fp8, names)
    except CalibrationError as exc:
        raise QuantizeError(str(exc)) from exc
    dataset = calibration_dataset
    if scheme == "fp4" and dataset is None and not (data / "clinc150").is_dir():
        dataset = "none"  # nothing shipped to calibrate on: plain rounding, and say so
        if notes is not None:
            notes.append(f"no shipped datasets at {data}: fp4 rounded to nearest without "
                         "calibration (give --calibration-dataset FILE)")
    calibrating = scheme == "fp4" and dataset != "none"
    if keep_fp8 is None and calibrating:  # the default that delivers: GPTQ alone agrees less
        auto_keep = cal.default_auto_keep(len(names))
    if auto_keep and not calibrating:
        raise QuantizeError("--keep-fp8 auto needs calibration (it ranks the layers by their "
                            "measured output error): drop --calibration-dataset none")
    float_engine = float_bytes = None
    if report:
        import copy

        from onepass.backends.torch import TorchBackend
        from onepass.engine import DecisionEngine
        from onepass.quant.report import float32_bytes

        float_engine = DecisionEngine(TorchBackend(copy.deepcopy(merged), tokenizer,
                                                   name="float"))
        float_bytes = float32_bytes(merged)
    calibration: dict[str, Any] | None = None
    with Progress(TextColumn("quantize {task.description}"), BarColumn(), MofNCompleteColumn(),
                  disable=not show_progress) as progress:
        if calibrating:
            from onepass.backends.torch import TorchBackend
            from onepass.engine import DecisionEngine

            samples = calibration_samples or DEFAULT_SAMPLES
            try:
                requests = cal.calibration_requests(dataset, samples, data)
                renderer = float_engine or DecisionEngine(TorchBackend(merged, tokenizer,
                                                                       name="calibration"))
                prompts = cal.prompt_ids(renderer, requests)
            except CalibrationError as exc:
                raise QuantizeError(str(exc)) from exc
            task = progress.add_task("gptq", total=len(names))
            result = cal.calibrate(merged, prompts, keep_fp8=kept, auto_keep=auto_keep,
                                   progress=lambda: progress.advance(task))
            kept = result.keep_fp8
            calibration = {**result.as_dict(), "dataset": dataset or "shipped",
                           "samples": samples}
        task = progress.add_task(scheme, total=len(names))
        summary = ({k: v for k, v in calibration.items() if k != "layer_errors"}
                   if calibration else {"method": "none"} if scheme == "fp4" else None)
        config = write_quantized(
            merged, tokenizer, out, scheme, dtype=torch_dtype, embedding=embedding,
            compute=compute, provenance={**provenance, "calibration": summary},
            progress=lambda: progress.advance(task),
            layer_schemes=dict.fromkeys(kept, "fp8"))
    if report:
        from onepass.quant.report import build_report, write_report

        measured = build_report(float_engine=float_engine, float_bytes=float_bytes,
                                directory=out, config=config,
                                probes=default_probes(data, report_probes),
                                calibration=calibration)
        write_report(out, measured)
        return {**config, "report": measured}
    return config


def run(args: argparse.Namespace) -> int:
    if getattr(args, "device", "auto") not in ("auto", "cpu"):
        print(f"onepass quantize: --device {args.device} is not supported: onepass quantizes "
              "on the CPU (the artifact is then served on any device); use --device cpu or "
              "leave it out", file=sys.stderr)
        return 2
    from onepass.commands.train import prefer_passive_openmp

    prefer_passive_openmp()
    from onepass.adapters import AdapterError
    from onepass.models import ModelError
    from onepass.quant.artifact import WEIGHTS, QuantizeError

    notes: list[str] = []
    try:
        config = quantize(args.model, args.adapter, args.quantization, args.output_directory,
                          args.dtype, show_progress=sys.stderr.isatty(),
                          embedding=args.embedding, compute=args.compute,
                          calibration_dataset=args.calibration_dataset,
                          calibration_samples=args.calibration_samples,
                          keep_fp8=args.keep_fp8, report=args.report,
                          report_probes=args.report_probes, data_dir=args.data_dir, notes=notes)
    except (AdapterError, ModelError, QuantizeError) as exc:
        print(f"onepass quantize: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"onepass quantize: {note}", file=sys.stderr)
    if "report" in config:
        from onepass.quant.report import print_report

        print_report(config["report"])
    size = (Path(args.output_directory) / WEIGHTS).stat().st_size
    layers = len(config.get("quantized_layers", []))
    kept = len(config.get("layer_schemes", {}))
    method = (config.get("calibration") or {}).get("method")
    print(f"wrote {args.output_directory} ({config['scheme']}: {layers} linear layers "
          f"quantized{f', {kept} kept at fp8' if kept else ''}"
          f"{f', {method} rounding' if method else ''}, {WEIGHTS} {size / 2**20:.1f} MiB)",
          file=sys.stderr)
    return 0
