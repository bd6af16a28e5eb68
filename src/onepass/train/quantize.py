"""In-memory weight quantization for QLoRA: a frozen base in 8 or 4 bits.

Each ``nn.Linear`` of the decoder is replaced by a :class:`QuantizedLinear` that stores
integer weights plus float32 scales and dequantizes them for the duration of its own forward,
so only one layer's float weights exist at a time and a base ~4x (int8) or ~7x (int4) larger
fits in the same memory. LoRA adapters sit on top (peft, registered as a custom module); the
quantized base is never written anywhere.

* int8: symmetric, one scale per output row (absmax / 127).
* int4: symmetric, one scale per ``block_size`` input weights (absmax / 7), two values
  packed per byte.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class QuantizedLinear(nn.Module):
    """A frozen linear layer held as int8 or packed int4, dequantized in ``forward``."""

    def __init__(self, linear: nn.Linear, bits: int = 4, block_size: int = 64):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits: expected 4 or 8, got {bits}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.bits = bits
        self.block_size = block_size
        weight = linear.weight.detach().float()
        if bits == 8:
            scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            q = torch.round(weight / scale).clamp(-127, 127).to(torch.int8)
        else:
            pad = (-self.in_features) % block_size
            padded = F.pad(weight, (0, pad))
            blocks = padded.view(self.out_features, -1, block_size)
            scale = blocks.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 7.0
            q = torch.round(blocks / scale).clamp(-8, 7).to(torch.int16) + 8  # 0..15
            q = q.view(self.out_features, -1).to(torch.uint8)
            q = q[:, 0::2] | (q[:, 1::2] << 4)
            scale = scale[..., 0]
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        if linear.bias is not None:
            self.register_buffer("bias", linear.bias.detach().clone())
        else:
            self.bias = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[out, in]`` this layer stands for."""
        if self.bits == 8:
            return (self.qweight.float() * self.scale).to(dtype)
        low = (self.qweight & 0x0F).to(torch.int16) - 8
        high = (self.qweight >> 4).to(torch.int16) - 8
        q = torch.stack((low, high), dim=-1).view(self.out_features, -1, self.block_size)
        weight = (q.float() * self.scale[..., None]).view(self.out_features, -1)
        return weight[:, : self.in_features].to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.dequantize(x.dtype)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}"


def quantize_decoder(model: Any, bits: int = 4, block_size: int = 64) -> int:
    """Replace every ``nn.Linear`` inside the decoder layers; returns how many were replaced.

    Embeddings and the output head stay as they are (the head's candidate rows are read in
    float, as at serving time).
    """
    decoder = model.get_decoder()
    targets = [
        (name, module) for name, module in decoder.named_modules()
        if isinstance(module, nn.Linear)
    ]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        setattr(parent, child, QuantizedLinear(module, bits, block_size))
    return len(targets)
