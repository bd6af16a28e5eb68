"""Row-invariant linears: a row's output bits must not depend on what else its call holds.

The batch-invariant attention (``packed_attention.py``) gives a token the same numbers alone,
beside other requests, on a cache miss or a hit only if every linear does too; a CPU's matmul
libraries pick kernels (and summation orders) by the number of rows. At load,
:func:`make_rows_invariant` probes the model's own linears and either pads short calls
(enough where the kernels agree from a few rows on) or runs every call in fixed row blocks.
The probe's finding is remembered per machine, library build, thread count, dtype and linear
shapes (:func:`probe_key`), so a second load on the same machine applies it without probing.
Training (gradients enabled) runs plain calls: there gradients matter, not last bits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def min_rows(dtype: torch.dtype) -> int:
    """The fewest rows a linear sees: below this the CPU's matmul libraries take another
    kernel (a matrix-vector product) whose sums round differently, so one token alone would
    read other bits than the same token beside others (measured on real activations:
    oneDNN bfloat16 differs at 1 row, MKL float32 at 1-3; every count above agrees)."""
    return 2 if dtype == torch.bfloat16 else 4


ROW_BLOCK = {torch.bfloat16: 32, torch.float32: 8}
"""Rows per linear call where the CPU's matmul kernels depend on the row count beyond
:func:`min_rows` (measured on a Xeon with AMX: oneDNN bfloat16 and MKL float32 each pick
kernels, and summation orders, by the number of rows up to hundreds, while a call of a fixed
row count gives a row the same bits at every position and beside any company). The sizes
trade a single stream's decode (a 1-row call padded to the block) against prefill (many calls
instead of one); per 576x1536 linear on 2 threads, against one unblocked call
(``benchmarks/row_blocks.py``): float32 block 4 costs 2.8x on a 512-row prefill
and 0.9x on a decode step, block 8 1.5x and 1.4x (the default), block 32 1.2x and 3.6x;
bfloat16 block 32 3.3x and 1.6x, block 64 2.4x and 2.3x."""


BATCHED_BLOCKS = {torch.float32: True}
"""Dtypes whose blocks run as one batched matmul (:func:`linear_in_row_blocks`): float32's
``bmm`` runs each block through the kernel a block alone takes, for about a plain call's cost
(a 512-row prefill in 8-row blocks: 1.12x an unblocked call, against 1.66x for a call per
block; AMD EPYC, 2 threads, ``benchmarks/row_blocks.py``); bfloat16's ``bmm`` takes a slow path
on CPU (4.6x for 32-row blocks, against 1.8x per call), so bfloat16 blocks run a call each."""


SCHEMES = ("padded", "blocked", "blocked per call")


def make_rows_invariant(model: Any, memo: Path | None = None) -> str:
    """Make every linear of ``model`` give a row the same bits whatever else its call holds,
    on this CPU, by the cheapest scheme a probe of the model's own linears (row counts from 1
    to 700) finds sufficient, once, at load:

    * ``"padded"`` (:func:`pad_short_rows`): where the kernels agree from :func:`min_rows` rows on;
    * ``"blocked"``: every product on fixed :data:`ROW_BLOCK`-row blocks, all of a call's
      blocks in one batched matmul, for the dtypes in :data:`BATCHED_BLOCKS` where the probe
      finds that invariant;
    * ``"blocked per call"``: one call per block, invariant by construction, otherwise.

    ``memo``: a folder where the finding is kept under :func:`probe_key`, so the next load
    with the same key applies it without the probe (a recalled load of the embedded model
    takes 0.55-0.61x of a probed one on a 2-core CPU, ``benchmarks/load_time.py``); an
    unreadable entry is probed again and rewritten."""
    pad_short_rows(model)
    floats = (torch.float32, torch.bfloat16, torch.float16)  # the activations' dtype, not a code
    dtype = next((p.dtype for p in model.parameters() if p.dtype in floats), torch.float32)
    linears = [m for m in model.modules() if type(m).__name__.endswith("Linear")]
    entry = memo / f"{probe_key(linears, dtype)}.json" if memo is not None else None
    scheme = _recall(entry)
    if scheme is None:
        scheme = _probe(linears, dtype)
        _remember(entry, scheme)
    else:
        _apply(linears, dtype, scheme)
    return scheme


def _probe(linears: list[Any], dtype: torch.dtype) -> str:
    """Find and apply the cheapest invariant scheme (see :func:`make_rows_invariant`)."""
    shapes = {(m.in_features, m.out_features): m for m in linears}  # one probe per shape
    if all(_rows_agree(m, dtype) for m in shapes.values()):
        return "padded"
    if BATCHED_BLOCKS.get(dtype, False):
        _apply(linears, dtype, "blocked")
        if all(_rows_agree(m, dtype) for m in shapes.values()):
            return "blocked"
    _apply(linears, dtype, "blocked per call")
    return "blocked per call"


def _apply(linears: list[Any], dtype: torch.dtype, scheme: str) -> None:
    if scheme != "padded":
        for module in linears:
            block_rows(module, ROW_BLOCK.get(dtype, 8), batched=scheme == "blocked")


def probe_key(linears: list[Any], dtype: torch.dtype) -> str:
    """A digest of everything a matmul library picks its kernels by: the processor (model and
    instruction-set flags), the torch build and its CPU capability, the thread count, the
    variables that steer MKL and oneDNN, the device, the dtype and the linears' kinds and
    shapes. Two loads with one key run the same kernels, so the probe would find the same."""
    device = next((p.device for m in linears for p in m.parameters()), torch.device("cpu"))
    facts = {
        "processor": _processor(),
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "environment": {k: os.environ.get(k) for k in (
            "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
            "ATEN_CPU_CAPABILITY")},
        "device": str(device),
        "accelerator": (torch.cuda.get_device_name(device) if device.type == "cuda" else None),
        "dtype": str(dtype),
        "linears": sorted({(type(m).__name__, m.in_features, m.out_features,
                            getattr(m, "bias", None) is not None) for m in linears}),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _processor() -> str:
    """The CPU's model name and flags (Linux), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = ("model name", "flags", "Features", "CPU part")
        return "\n".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in wanted}))
    return f"{platform.machine()} {platform.processor()}"


def _recall(entry: Path | None) -> str | None:
    if entry is None:
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        scheme = json.loads(entry.read_text()).get("scheme")
        if scheme in SCHEMES:
            return scheme
    return None


def _remember(entry: Path | None, scheme: str) -> None:
    """Write the finding atomically (a concurrent load reads a whole entry or none); a cache
    that cannot be written costs the next load a probe, nothing else."""
    if entry is None:
        return
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"scheme": scheme}, f)
            os.replace(tmp, entry)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@torch.inference_mode()
def _rows_agree(module: Any, dtype: torch.dtype) -> bool:
    """Whether ``module`` gives the last rows of a 700-row input the same bits alone."""
    generator = torch.Generator().manual_seed(0)
    device = next(module.buffers(), None)
    device = next(module.parameters(), device)
    x = torch.randn(700, module.in_features, generator=generator).to(
        device.device if device is not None else "cpu", dtype)
    whole = module(x)
    return all(torch.equal(module(x[-rows:]), whole[-rows:])
               for rows in (1, 2, 3, 5, 8, 17, 32, 33, 64, 128, 256))


def _padded_to_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """``x``'s rows, flat, the last block padded with copies of the first row; the row count."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows % block:
        flat = torch.cat([flat, flat[:1].expand(block - rows % block, -1)])
    return flat, rows


def _unblocked(x: torch.Tensor, block: int | None) -> bool:
    """Whether a product over ``x`` runs as one plain call: no block, no rows, or gradients on
    (training needs gradients, not last bits)."""
    return not block or x.numel() == 0 or torch.is_grad_enabled()


def in_row_blocks(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  block: int | None) -> torch.Tensor:
    """``product(x)`` computed ``block`` rows per call: the rows split into blocks, the last
    padded with copies of the first row, the padding's outputs dropped. One plain call when
    :func:`_unblocked`."""
    if _unblocked(x, block):
        return product(x)
    flat, rows = _padded_to_blocks(x, block)
    out = torch.cat([product(part) for part in flat.split(block)])
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def linear_in_row_blocks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         block: int | None, batched: bool = True) -> torch.Tensor:
    """``x W^T + b`` on ``block``-row blocks: all blocks in one batched matmul (``batched``: a
    ``bmm`` runs each block as its own product of one shape, without a call per block) or one
    call per block (:func:`in_row_blocks`)."""
    if _unblocked(x, block) or not batched:
        return in_row_blocks(lambda rows: F.linear(rows, weight, bias), x, block)
    flat, rows = _padded_to_blocks(x, block)
    blocks = flat.view(-1, block, flat.shape[-1])
    weights = weight.t().expand(blocks.shape[0], -1, -1)
    if bias is None:
        out = torch.bmm(blocks, weights)
    else:
        out = torch.baddbmm(bias.expand(blocks.shape[0], block, -1), blocks, weights)
    return out.reshape(-1, weight.shape[0])[:rows].reshape(*x.shape[:-1], weight.shape[0])


def block_rows(module: Any, block: int, batched: bool = True) -> None:
    """Run ``module`` on ``block`` rows per product, always: a plain ``nn.Linear`` all blocks
    in one batched matmul (``batched``, :func:`linear_in_row_blocks`), else one call of its
    forward per block (:func:`in_row_blocks`).
    A module with a ``row_block`` attribute blocks its own product (a quantized linear decodes
    its weight once per call, not once per block). Calling it again replaces the scheme."""
    if hasattr(module, "row_block"):
        module.row_block, module.row_batched = block, batched
        return
    forward = module.__dict__.setdefault("_onepass_plain_forward", module.forward)
    if batched and type(module).forward is torch.nn.Linear.forward:

        def blocked(x: torch.Tensor) -> torch.Tensor:
            return linear_in_row_blocks(x, module.weight, module.bias, block, batched)
    else:

        def blocked(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            return in_row_blocks(lambda rows: forward(rows, *args, **kwargs), x, block)

    module.forward = blocked


def pad_short_rows(model: Any) -> None:
    """Run every linear of ``model`` on at least :func:`min_rows` rows (a forward of fewer
    tokens repeats its first row and keeps its own rows' outputs): the row-invariance the
    batch-invariant attention relies on, for single-stream decoding too (a 2-row product
    costs what a 1-row one does in bfloat16)."""

    def pad(module: Any, args: tuple) -> tuple | None:
        x = args[0]
        rows = x.numel() // x.shape[-1]
        want = min_rows(x.dtype)
        if rows == 0 or rows >= want:
            return None
        flat = x.reshape(rows, x.shape[-1])
        module._onepass_rows = (rows, x.shape[:-1])
        return (torch.cat([flat, flat[:1].expand(want - rows, -1)]), *args[1:])

    def unpad(module: Any, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        stashed = module.__dict__.pop("_onepass_rows", None)
        if stashed is None:
            return None
        rows, shape = stashed
        return out[:rows].reshape(*shape, out.shape[-1])

    for module in model.modules():
        if type(module).__name__.endswith("Linear") and not getattr(module, "_onepass_padded",
                                                                     False):
            module.register_forward_pre_hook(pad)
            module.register_forward_hook(unpad)
            module._onepass_padded = True
