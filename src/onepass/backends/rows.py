"""Row-invariant linears: a row's output bits must not depend on what else its call holds.

The batch-invariant attention (``packed_attention.py``) gives a token the same numbers alone,
beside other requests, on a cache miss or a hit only if every linear does too; a CPU's matmul
libraries pick kernels (and summation orders) by the number of rows. At load,
:func:`make_rows_invariant` probes the model's own linears and either pads short calls
(enough where the kernels agree from a few rows on) or runs every call in fixed row blocks.
Training (gradients enabled) runs plain calls: there gradients matter, not last bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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


def make_rows_invariant(model: Any) -> str:
    """Make every linear of ``model`` give a row the same bits whatever else its call holds,
    on this CPU: ``"padded"`` (:func:`pad_short_rows`: enough where the kernels agree from
    :func:`min_rows` rows on) when a probe of the model's own linears at row counts from 1 to
    700 finds that enough, else ``"blocked"`` (:func:`block_rows`: every call exactly
    :data:`ROW_BLOCK` rows, by construction). Once, at load."""
    pad_short_rows(model)
    floats = (torch.float32, torch.bfloat16, torch.float16)  # the activations' dtype, not a code
    dtype = next((p.dtype for p in model.parameters() if p.dtype in floats), torch.float32)
    linears = [m for m in model.modules() if type(m).__name__.endswith("Linear")]
    shapes = {(m.in_features, m.out_features): m for m in linears}  # one probe per shape
    if all(_rows_agree(m, dtype) for m in shapes.values()):
        return "padded"
    for module in linears:
        block_rows(module, ROW_BLOCK.get(dtype, 8))
    return "blocked"


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


def in_row_blocks(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  block: int | None) -> torch.Tensor:
    """``product(x)`` computed ``block`` rows per call: the rows split into blocks, the last
    padded with copies of the first row, the padding's outputs dropped. One plain call when
    ``block`` is None or gradients are enabled (training needs gradients, not last bits)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if not block or rows == 0 or torch.is_grad_enabled():
        return product(x)
    if rows % block:
        flat = torch.cat([flat, flat[:1].expand(block - rows % block, -1)])
    out = torch.cat([product(part) for part in flat.split(block)])
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def block_rows(module: Any, block: int) -> None:
    """Run ``module`` on ``block`` rows per call, always (:func:`in_row_blocks`). A module
    with a ``row_block`` attribute blocks its own product (a quantized linear decodes its
    weight once per call, not once per block)."""
    if hasattr(module, "row_block"):
        module.row_block = block
        return
    forward = module.forward

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
