"""Where one request's time goes, how much of the CPU's matmul peak it reaches, and whether
``torch.compile`` pays. Prints ratios and shares from one run.

* the matmul peak: one 576x1536 linear over 1,400 tokens in the request's dtype (the shape of
  the embedded model's MLP), GFLOP/s;
* a profile of the 16-question request on the ~512-token state (miss and hit) under the PyTorch
  profiler, its time split into: linears (the model's matmuls), the attention kernel, the rest
  of attention (rotary, reshapes, the key/value cache), norms, the MLP's activation, onepass's
  mask building, the candidate readout, and what is left (Python between layers, dispatch);
* the request's matmul FLOPs over its wall time (unprofiled) as a share of the peak;
* ``torch.compile`` of the decoder (inductor, dynamic shapes): compile time of the first
  request, the median of later misses/hits against eager, and a request of another shape (a
  recompile or not); kept only if the saving repays the compile within a short session.

    .venv/bin/python benchmarks/profile_forward.py [--repeats 5] [--no-compile]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from functools import partial

import torch
from engine_speed import STATE, questions, timed
from torch.profiler import ProfilerActivity, profile, record_function

from onepass import prompt as P
from onepass.engine import DecisionEngine

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_int_mm",
              "aten::mkldnn_linear", "aten::_mkl_linear"}
ATTENTION_KERNEL = ("scaled_dot_product", "flash_attention")
#: module class-name endings -> the share they are reported under (time minus nested linears)
LABEL = "onepass::"  # the prefix of this script's profiler ranges
MODULE_GROUPS = {"RMSNorm": "norms", "Attention": "attention (rest)", "MLP": "MLP activation",
                 "RotaryEmbedding": "attention (rest)"}


def matmul_peak(dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of one 576x1536 linear over 1,400 tokens: what this CPU's matmul unit gives."""
    x = torch.randn(1400, 576, dtype=dtype)
    w = torch.randn(1536, 576, dtype=dtype)
    with torch.inference_mode():
        for _ in range(3):
            torch.nn.functional.linear(x, w)
        seconds = timed(lambda: torch.nn.functional.linear(x, w), repeats * 4)
    return 2 * 1400 * 576 * 1536 / seconds / 1e9


def label_modules(model: torch.nn.Module) -> list:
    """Wrap each norm / attention / MLP / rotary module's forward in a profiler range."""
    handles = []
    for module in model.modules():
        kind = type(module).__name__
        if _module_group(kind) is None:
            continue
        ranges: list = []

        def enter(mod, args, ranges=ranges, name=f"{LABEL}{kind}"):
            ranges.append(record_function(name))
            ranges[-1].__enter__()

        def leave(mod, args, out, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def wrap_method(obj, name: str, label: str) -> None:
    method = getattr(obj, name)

    def wrapped(*args, **kwargs):
        with record_function(label):
            return method(*args, **kwargs)

    setattr(obj, name, wrapped)


def split(prof, wall: float) -> tuple[dict[str, float], float]:
    """Seconds per share of the profiled request, and its matmul FLOPs. Kernels count by their
    own time; a labelled range (module or method) counts its time minus the kernels and the
    labelled ranges nested in it."""
    us: dict[str, float] = defaultdict(float)
    flops = 0.0
    for e in prof.events():
        owner = _labelled_ancestor(e)
        kernel = _kernel(e.name)
        if kernel is not None:
            us[kernel] += e.self_cpu_time_total
            flops += e.flops or 0
            spent = e.self_cpu_time_total
        elif e.name.startswith(LABEL):
            us[_label_group(e.name)] += e.cpu_time_total
            spent = e.cpu_time_total
        else:
            continue
        if owner is not None:
            us[_label_group(owner.name)] -= spent
    seconds = {k: v / 1e6 for k, v in us.items()}
    seconds["Python between ops, dispatch, other"] = wall - sum(seconds.values())
    return seconds, flops


def _kernel(name: str) -> str | None:
    if name in MATMUL_OPS:
        return "linears (matmul)"
    if any(k in name for k in ATTENTION_KERNEL):
        return "attention kernel"
    return None


def _module_group(kind: str) -> str | None:
    return next((g for end, g in MODULE_GROUPS.items() if kind.endswith(end)), None)


def _label_group(label: str) -> str:
    kind = label.removeprefix(LABEL)
    return _module_group(kind) or kind


def _labelled_ancestor(event):
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(LABEL):
        parent = parent.cpu_parent
    return parent


def profile_request(engine, fn, title: str, peak: float, repeats: int) -> None:
    fn()  # warm
    unprofiled = timed(fn, repeats)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    seconds, flops = split(prof, wall)
    print(f"\n{title}: {unprofiled * 1000:.0f} ms unprofiled, {wall * 1000:.0f} ms profiled; "
          f"matmul work {flops / 1e9:.1f} GFLOP")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:38} {s / wall:6.1%}")
    achieved = flops / unprofiled / 1e9
    matmul_s = seconds.get("linears (matmul)", 0.0) * unprofiled / wall
    inside = flops / matmul_s / 1e9 if matmul_s else 0.0
    print(f"  whole request: {achieved:.0f} GFLOP/s = {achieved / peak:.0%} of the matmul peak; "
          f"inside the linears {inside:.0f} GFLOP/s = {inside / peak:.0%}")


def try_compile(engine, text, positions, other, repeats: int) -> None:
    backend = engine.backend

    def cold(pos=positions):
        backend.cache.clear()
        engine.score_positions(text, pos)

    eager_miss = timed(cold, repeats)
    eager_hit = timed(partial(engine.score_positions, text, positions), repeats)
    eager_other = timed(partial(cold, other), repeats)
    eager = backend.decoder
    try:
        backend.decoder = torch.compile(eager, dynamic=True)
        start = time.perf_counter()
        cold()
        first = time.perf_counter() - start
        start = time.perf_counter()
        cold(other)
        first_other = time.perf_counter() - start
        miss = timed(cold, repeats)
        hit = timed(partial(engine.score_positions, text, positions), repeats)
        other_t = timed(partial(cold, other), repeats)
    except Exception as error:  # noqa: BLE001 - the benchmark reports why compile failed
        print(f"\ntorch.compile failed: {type(error).__name__}: {str(error)[:300]}")
        return
    finally:
        backend.decoder = eager
    saved = eager_miss - miss
    print(f"\ntorch.compile (inductor, dynamic=True) on the decoder:\n"
          f"  first request {first:.1f} s (compile) vs eager miss {eager_miss * 1000:.0f} ms; "
          f"first request of another shape {first_other:.1f} s\n"
          f"  then miss {miss / eager_miss:.2f}x eager, hit {hit / eager_hit:.2f}x, "
          f"other shape {other_t / eager_other:.2f}x")
    if saved > 0:
        print(f"  break-even after {(first - miss) / saved:.0f} misses")
    else:
        print("  never repays its compile time: not kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compute", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    engine = DecisionEngine.from_pretrained(args.model, device="cpu", dtype=args.dtype,
                                            compute=args.compute)
    backend = engine.backend
    dtype = next(backend.decoder.parameters()).dtype
    peak = matmul_peak(dtype, args.repeats)
    print(f"model={engine.served_name} dtype={dtype} compute={backend.compute} "
          f"threads={torch.get_num_threads()}; matmul peak ({dtype}, 1400x576 @ 576x1536) "
          f"{peak:.0f} GFLOP/s")
    text = P.render_prefix(engine.format, STATE, None, engine.specials)
    positions = [engine.position(*q) for q in questions(16)]

    def cold():
        backend.cache.clear()
        engine.score_positions(text, positions)

    handles = label_modules(backend.decoder)
    wrap_method(backend, "_packed_mask", f"{LABEL}mask building")
    wrap_method(backend, "_candidate_logits", f"{LABEL}candidate readout")
    profile_request(engine, cold, "16 questions, miss", peak, args.repeats)
    profile_request(engine, partial(engine.score_positions, text, positions),
                    "16 questions, hit", peak, args.repeats)
    for handle in handles:
        handle.remove()
    if not args.no_compile:
        try_compile(engine, text, positions, [engine.position(*q) for q in questions(5)],
                    args.repeats)


if __name__ == "__main__":
    main()
