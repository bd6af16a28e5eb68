"""A linear layer held quantized in memory and dequantized only for its own forward.

Only one layer's float weight exists at a time, so resident weight memory is what the codec
stores (plus the layers left in high precision). Used for served FP8 / MXFP4 artifacts and for
QLoRA's frozen base.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from onepass.quant.formats import Codec, Tensors


class QuantizedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` decoded from ``codec`` tensors on every call."""

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
        y = F.linear(x, weight)
        if scale is not None:
            y = y * scale
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, format={self.codec.name}"


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
