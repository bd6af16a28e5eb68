"""Linear layers held quantized in memory.

* :class:`QuantizedLinear` dequantizes its weight for its own forward only: one layer's float
  weight exists at a time, so resident weight memory is what the codec stores (the smallest, the
  slowest: every forward re-decodes). Used for ``--compute stored`` artifacts and QLoRA's base.
* :class:`Int8Linear` keeps per-output-channel int8 weights for ``torch._int_mm`` (int8 dot
  products on VNNI units; activations quantized per token on each call), so one matmul runs in
  int8 with nothing decoded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from onepass.backends.rows import linear_in_row_blocks
from onepass.quant.formats import Codec, Tensors


class QuantizedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` decoded from ``codec`` tensors on every call."""

    row_block: int | None = None  # rows per product (backends/rows.py), the decode once a call
    row_batched: bool = True  # the blocks in one batched matmul (backends/rows.py)

    def __init__(self, codec: Codec, in_features: int, out_features: int, tensors: Tensors,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.codec = codec
        self.in_features = in_features
        self.out_features = out_features
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor.contiguous())
        self._names = tuple(tensors)
        if bias is not None:
            self.register_buffer("bias", bias.detach().clone())
        else:
            self.bias = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, codec: Codec) -> QuantizedLinear:
        return cls(codec, linear.in_features, linear.out_features,
                   codec.encode(linear.weight), linear.bias)

    def tensors(self) -> Tensors:
        return {name: getattr(self, name) for name in self._names}

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[out, in]`` this layer stands for."""
        return self.codec.decode(self.tensors(), self.in_features, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self.codec.decode_for_matmul(self.tensors(), self.in_features, x.dtype)
        y = linear_in_row_blocks(x, weight, None, self.row_block, self.row_batched)
        if scale is not None:
            y = y * scale
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, format={self.codec.name}"


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with ``W = q * scale[out]`` (int8 ``q``), computed in int8 by
    ``torch._int_mm`` (oneDNN: int32-accumulating dot products on VNNI units). Activations are
    quantized per token (one scale per row), not per tensor: in a packed decision forward a few
    tokens (the first, the separators) carry activations ~100x the rest, and one scale for all
    of them rounded every other token to a handful of levels (top-answer agreement with float32
    0.83 on the probe set with PyTorch's per-tensor dynamic kernel)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None, smooth: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(f"expected a 2-D int8 weight, got {qweight.dtype} "
                             f"{tuple(qweight.shape)}")
        self.out_features, self.in_features = qweight.shape
        # [in, out] contiguous: the layout _int_mm multiplies fastest (about 2x the transpose)
        self.register_buffer("qweight_t", qweight.detach().t().contiguous())
        self.register_buffer("scale", scale.detach().reshape(1, -1).float().clone())
        if bias is not None:
            self.register_buffer("bias", bias.detach().float().clone())
        else:
            self.bias = None
        # SmoothQuant (quant/smooth.py): the int8 weight is W * s per input column; x / s is
        # what gets rounded
        if smooth is not None:
            self.register_buffer("smooth", smooth.detach().float().reshape(-1).clone())
        else:
            self.smooth = None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    smooth: torch.Tensor | None = None) -> Int8Linear:
        """Quantize a float weight (symmetric, one scale per output channel), after scaling its
        input columns by ``smooth`` when given."""
        from onepass.quant.formats import Int8Codec

        weight = weight.detach().float()
        if smooth is not None:
            weight = weight * smooth.float()[None, :]
        encoded = Int8Codec().encode(weight)
        return cls(encoded["qweight"], encoded["scale"], bias, smooth)

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 weight ``[out, in]``, float32 scale ``[out]``), smoothing included."""
        return self.qweight_t.t().contiguous(), self.scale.reshape(-1).clone()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight in the input's own space (the smoothing divided back out)."""
        weight, scale = self.int8_weight()
        weight = weight.float() * scale[:, None]
        if self.smooth is not None:
            weight = weight / self.smooth[None, :]
        return weight.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        if self.smooth is not None:
            flat = flat / self.smooth
        # max |x| per token without an |x| copy; in-place steps: this runs on every layer
        top = torch.maximum(flat.amax(dim=1, keepdim=True), flat.amin(dim=1, keepdim=True).neg_())
        step = top.clamp_min_(1e-12).div_(127.0)
        q = torch.div(flat, step).round_().clamp_(-127, 127).to(torch.int8)
        y = torch._int_mm(q, self.qweight_t).float().mul_(step).mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        smoothed = ", smoothed" if self.smooth is not None else ""
        return f"in={self.in_features}, out={self.out_features}, format=int8 (per-token{smoothed})"


class Fp8Linear(nn.Module):
    """``y = x W^T + b`` on fp8 matrix units: ``torch._scaled_mm`` multiplies an E4M3 weight
    (one float32 scale per output row: an fp8 artifact's own tensors, used as stored) by the
    activations rounded to E4M3 with one scale per token, accumulating in higher precision.
    GPUs with fp8 tensor cores (CUDA compute capability 8.9+: Ada, Hopper, Blackwell) run it
    natively; PyTorch's CPU kernel computes the same numbers about 3x slower than bfloat16, so
    loading refuses ``fp8`` on a CPU (tests use the CPU kernel to check the arithmetic)."""

    E4M3_MAX = 448.0

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if weight.dtype == torch.uint8:  # an artifact's raw E4M3 bytes
            weight = weight.view(torch.float8_e4m3fn)
        if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
            raise ValueError(f"expected a 2-D float8_e4m3fn weight, got {weight.dtype} "
                             f"{tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.detach().contiguous())
        self.register_buffer("scale", scale.detach().reshape(1, -1).float().contiguous())
        if bias is not None:
            self.register_buffer("bias", bias.detach().float().clone())
        else:
            self.bias = None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Fp8Linear:
        from onepass.quant.formats import Fp8Codec

        encoded = Fp8Codec().encode(weight.detach().float())
        return cls(encoded["qweight"], encoded["scale"], bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale.reshape(-1, 1)).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        rows = flat.shape[0]
        if flat.is_cuda and rows % 16:  # the CUDA kernel wants whole tiles of 16 rows
            flat = F.pad(flat, (0, 0, 0, 16 - rows % 16))
        step = flat.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(self.E4M3_MAX)
        q = (flat / step).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(q, self.weight.t(), scale_a=step, scale_b=self.scale,
                             out_dtype=torch.bfloat16)[:rows].float()
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, format=fp8 (per-token)"


def decoder_linears(model: Any) -> list[tuple[str, nn.Linear]]:
    """Every ``nn.Linear`` inside the decoder stack, by its name in ``model``.

    The embeddings and the output head are not decoder linears: the head's candidate rows are
    the decision logits themselves, and on tied models it *is* the embedding table.
    """
    inside = {id(module) for module in model.get_decoder().modules()}
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and id(module) in inside]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def quantize_linears(model: Any, codec: Codec, progress: Any = None) -> int:
    """Replace every decoder linear by a :class:`QuantizedLinear`; returns how many."""
    targets = decoder_linears(model)
    for name, module in targets:
        replace_module(model, name, QuantizedLinear.from_linear(module, codec))
        if progress is not None:
            progress()
    return len(targets)


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters and buffers (shared storage counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in (*model.parameters(), *model.buffers()):
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def to_working_weights(model: Any, compute: str, dtype: torch.dtype,
                       only: str | None = None,
                       maxima: dict[str, torch.Tensor] | None = None) -> int:
    """Decode every decoder linear ONCE into fast working weights; returns how many changed.

    ``int8``: :class:`Int8Linear` (a stored layer re-quantized per output channel; a float one
    quantized), smoothed where ``maxima`` (:func:`onepass.quant.smooth.activation_maxima`)
    names the layer; ``fp8``: :class:`Fp8Linear` (an fp8 layer's stored tensors as they are,
    anything else encoded to fp8); ``float``: a plain ``nn.Linear`` in ``dtype`` (what a float
    model runs). ``only`` limits it to the layer of that name."""
    if compute not in ("int8", "fp8", "float"):
        raise ValueError(f"compute: expected int8, fp8 or float, got {compute!r}")
    changed = 0
    for name, module in working_candidates(model):
        if only is not None and name != only:
            continue
        bias = module.bias
        if compute == "fp8":
            if isinstance(module, Fp8Linear):
                continue
            if isinstance(module, QuantizedLinear) and module.codec.name == "fp8":
                stored = module.tensors()
                new: nn.Module = Fp8Linear(stored["qweight"], stored["scale"], bias)
            else:
                new = Fp8Linear.from_weight(_float_weight(module), bias)
        elif compute == "int8":
            smoothed = maxima is not None and name in maxima
            if isinstance(module, Int8Linear) and (module.smooth is not None or not smoothed):
                continue
            weight = _float_weight(module)
            smooth = None
            if smoothed:
                from onepass.quant.smooth import smoothing

                smooth = smoothing(maxima[name], weight)  # type: ignore[index]
            new = Int8Linear.from_weight(
                weight, None if bias is None else bias.detach().float(), smooth)
        else:
            if not isinstance(module, (QuantizedLinear, Int8Linear, Fp8Linear)):
                continue
            weight = module.dequantize(dtype)
            new = nn.Linear(module.in_features, module.out_features, bias=bias is not None,
                            dtype=dtype, device=weight.device)
            with torch.no_grad():
                new.weight.copy_(weight)
                if bias is not None:
                    new.bias.copy_(bias.to(dtype))
            new.requires_grad_(False)
        replace_module(model, name, new)
        changed += 1
    return changed


def _float_weight(module: nn.Module) -> torch.Tensor:
    """The float32 weight a decoder linear in any form stands for."""
    if isinstance(module, nn.Linear):
        return module.weight.detach().float()
    return module.dequantize(torch.float32)  # type: ignore[operator]


def working_candidates(model: Any) -> list[tuple[str, nn.Module]]:
    """The decoder's linear layers in any form: float, stored-quantized or int8."""
    inside = {id(module) for module in model.get_decoder().modules()}
    kinds = (nn.Linear, QuantizedLinear, Int8Linear, Fp8Linear)
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, kinds) and id(module) in inside]
