"""What a quantization traded, measured: ``onepass quantize --report``.

The report compares the written artifact, loaded the way ``onepass serve`` loads it, with the
float model it came from: top-answer agreement and mean total-variation distance over the probe
requests (the fixed 100 of :func:`onepass.datasets.probe_requests`), the file size against the
float32 weights, the resident weight bytes (with the recorded working weights, and kept stored),
the median latency of one request (cache misses, the two models taking turns),
and the relative output error of every decoder linear on the calibration activations (which
is how the fp8 layers were chosen). ``report.json`` carries every number, ``report.md`` the
summary and the worst layers; :func:`print_report` shows the same as rich tables.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SHOWN_LAYERS = 10  # layers listed in the table and report.md (all are in report.json)


def float32_bytes(model: Any) -> int:
    """The model's weights as float32 (tied tables once): the ratios' denominator."""
    seen: set[int] = set()
    total = 0
    for tensor in model.state_dict().values():
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * 4
    return total


def timed_answers(engines: Sequence[Any], requests: Sequence[dict[str, Any]]
                  ) -> list[tuple[list[Any], float]]:
    """Per engine: every answer and the median seconds of one request. The engines take turns
    on each request (after one warm-up answer each), so a busy machine slows them alike."""
    for engine in engines:
        if requests:
            engine.answer(requests[0])
    answers: list[list[Any]] = [[] for _ in engines]
    seconds: list[list[float]] = [[] for _ in engines]
    for request in requests:
        for i, engine in enumerate(engines):
            start = time.perf_counter()
            answers[i].append(engine.answer(request))
            seconds[i].append(time.perf_counter() - start)
    return [(a, statistics.median(s) if s else 0.0) for a, s in zip(answers, seconds)]


def build_report(
    *,
    float_engine: Any,
    float_bytes: int,
    directory: Path,
    config: dict[str, Any],
    probes: Sequence[dict[str, Any]],
    calibration: dict[str, Any] | None,
) -> dict[str, Any]:
    """Load ``directory`` as served, answer ``probes`` with it and the float engine, compare."""
    from onepass.backends.torch import TorchBackend
    from onepass.engine import DecisionEngine
    from onepass.evaluate import compare_answers
    from onepass.quant.artifact import WEIGHTS

    quantized = DecisionEngine(TorchBackend.load(directory, name="quantized", device="cpu",
                                                 dtype="float32"))
    (reference, float_latency), (answers, latency) = timed_answers([float_engine, quantized],
                                                                    probes)
    stored = TorchBackend.load(directory, name="stored", device="cpu", dtype="float32",
                               compute="stored").weight_bytes
    agreement = compare_answers(reference, answers)
    disk = (directory / WEIGHTS).stat().st_size
    errors = (calibration or {}).get("layer_errors", {})
    scheme = config["scheme"]
    return {
        "scheme": scheme,
        "layer_schemes": config.get("layer_schemes", {}),
        "keep_fp8": sorted(config.get("layer_schemes", {})),
        "calibration": {k: v for k, v in (calibration or {}).items() if k != "layer_errors"}
        or None,
        "probe": {"requests": len(probes), "questions": agreement["questions"],
                  "agreement": agreement["agreement"], "mean_tv": agreement["mean_tv"],
                  "max_tv": agreement["max_tv"]},
        "size": {"disk_bytes": disk, "float32_bytes": float_bytes,
                 "disk_ratio": disk / float_bytes,
                 "resident_bytes": quantized.backend.weight_bytes,
                 "resident_ratio": quantized.backend.weight_bytes / float_bytes,
                 "compute": quantized.backend.compute,
                 "resident_stored_bytes": stored, "resident_stored_ratio": stored / float_bytes},
        "latency": {"median_seconds": latency, "float_median_seconds": float_latency,
                    "ratio": latency / float_latency if float_latency else None},
        "layer_errors": errors,
    }


def _worst(report: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    errors = report["layer_errors"]
    key = _error_key(report)
    return sorted(errors.items(), key=lambda kv: kv[1].get(key, 0.0), reverse=True)[:SHOWN_LAYERS]


def _error_key(report: dict[str, Any]) -> str:
    """The column layers are ranked by: what ``--keep-fp8 auto`` ranked them by (``impact``)
    when it ran, else GPTQ's output error, else plain rounding's."""
    errors = report["layer_errors"]
    first = next(iter(errors.values()), {})
    return next((k for k in ("impact", "gptq", "rtn") if k in first), "rtn")


def write_report(directory: Path, report: dict[str, Any]) -> None:
    """``report.json`` (every number) and ``report.md`` (the summary, the worst layers)."""
    directory = Path(directory)
    (directory / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    probe, size, latency = report["probe"], report["size"], report["latency"]
    calibration = report.get("calibration") or {}
    lines = [
        f"# onepass quantize: {report['scheme']}",
        "",
        f"- calibration: {calibration.get('method', 'none')}"
        + (f" on {calibration['prompts']} prompts ({calibration['tokens']} tokens, "
           f"{calibration['dataset']})" if calibration else ""),
        f"- kept at fp8: {', '.join(report['keep_fp8']) or 'none'}",
        f"- probe set ({probe['requests']} requests): top-answer agreement "
        f"{probe['agreement']:.2f}, mean TV {probe['mean_tv']:.3f} vs the float model",
        f"- disk {size['disk_bytes'] / 2**20:.1f} MiB ({size['disk_ratio']:.2f}x float32), "
        f"resident weights {size['resident_bytes'] / 2**20:.1f} MiB "
        f"({size['resident_ratio']:.2f}x, compute {size['compute']}; "
        f"{size['resident_stored_bytes'] / 2**20:.1f} MiB, "
        f"{size['resident_stored_ratio']:.2f}x, with --compute stored)",
        f"- median latency of one request {latency['median_seconds'] * 1e3:.0f} ms "
        f"(float {latency['float_median_seconds'] * 1e3:.0f} ms)",
    ]
    worst = _worst(report)
    if worst:
        columns = list(worst[0][1])
        lines += ["", f"Largest relative output errors ({_error_key(report)}), on the "
                  "calibration activations:", "",
                  "| layer | " + " | ".join(columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        lines += [f"| {name} | " + " | ".join(f"{e[c]:.4f}" for c in columns) + " |"
                  for name, e in worst]
    (directory / REPORT_MD).write_text("\n".join(lines) + "\n")


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """The report as two rich tables: the summary and the worst layers."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(stderr=True)
    probe, size, latency = report["probe"], report["size"], report["latency"]
    calibration = report.get("calibration") or {}
    summary = Table(title=f"onepass quantize {report['scheme']}: what it traded",
                    show_header=False)
    summary.add_column("what")
    summary.add_column("value")
    summary.add_row("calibration", calibration.get("method", "none")
                    + (f" ({calibration['prompts']} prompts, {calibration['tokens']} tokens)"
                       if calibration else ""))
    summary.add_row("kept at fp8", ", ".join(report["keep_fp8"]) or "none")
    summary.add_row(f"probe agreement ({probe['requests']} requests)",
                    f"{probe['agreement']:.2f}")
    summary.add_row("probe mean TV", f"{probe['mean_tv']:.3f}")
    summary.add_row("disk", f"{size['disk_bytes'] / 2**20:.1f} MiB "
                    f"({size['disk_ratio']:.2f}x float32)")
    summary.add_row(f"resident weights ({size['compute']})",
                    f"{size['resident_bytes'] / 2**20:.1f} MiB ({size['resident_ratio']:.2f}x)")
    if size["compute"] != "stored":
        summary.add_row("resident weights (stored)",
                        f"{size['resident_stored_bytes'] / 2**20:.1f} MiB "
                        f"({size['resident_stored_ratio']:.2f}x)")
    summary.add_row("median latency", f"{latency['median_seconds'] * 1e3:.0f} ms (float "
                    f"{latency['float_median_seconds'] * 1e3:.0f} ms)")
    console.print(summary)
    worst = _worst(report)
    if worst:
        layers = Table(title=f"largest relative output errors ({_error_key(report)})")
        layers.add_column("layer")
        columns = list(worst[0][1])
        for column in columns:
            layers.add_column(column, justify="right")
        for name, errors in worst:
            kept = " (fp8)" if name in report["keep_fp8"] else ""
            layers.add_row(name + kept, *(f"{errors[c]:.4f}" for c in columns))
        console.print(layers)
