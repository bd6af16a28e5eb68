"""Weight codecs: how a float matrix ``[out, in]`` becomes a few small tensors and back.

Pure tensor arithmetic (no modules, no files). Four codecs share one interface, ``encode``
(float weight -> named tensors) and ``decode`` (named tensors -> float weight):

* ``fp8``   float8 E4M3 (bias 7, no infinities, max 448) with one float32 scale per output
  channel: ``w ~= e4m3 * scale[out]``, ``scale = absmax(row) / 448``.
* ``mxfp4`` OCP Microscaling FP4: E2M1 values (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) packed two per
  byte, element ``2i`` in the low nibble, with one E8M0 exponent (a power of two, stored as
  ``exponent + 127`` in a byte) shared by each block of 32 consecutive input weights; rows whose
  length is not a multiple of 32 are zero-padded, so the original shape must travel with it.
* ``int8``  symmetric, one scale per output row (``absmax / 127``); QLoRA's 8-bit base.
* ``int4``  symmetric, one scale per block of input weights (``absmax / 7``), packed two per
  byte; QLoRA's 4-bit base.

Rounding is to nearest, ties to even, saturating at the largest finite value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

Tensors = dict[str, torch.Tensor]

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of E2M1's largest power of two (4 = 2**2)
MX_BLOCK = 32
E8M0_BIAS = 127

# code -> value for the 16 E2M1 codes (bit 3 is the sign)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# halfway points between neighbouring magnitudes; at the ones listed in _E2M1_TIES_UP the even
# code is the upper neighbour, at the others the lower one
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIES_UP = (0.75, 1.75, 3.5)


# ---------------------------------------------------------------------------- element formats

def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Float values -> E4M3 bit patterns (uint8), saturating at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def decode_e4m3(bits: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return bits.view(torch.float8_e4m3fn).to(dtype)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Float values -> E2M1 codes 0..15 (uint8), saturating at +-6."""
    x = x.float()
    magnitude = x.abs().clamp(max=E2M1_MAX)
    midpoints = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    code = torch.bucketize(magnitude, midpoints)  # a value on a midpoint goes down ...
    ties_up = torch.tensor(_E2M1_TIES_UP, device=x.device)
    code += torch.isin(magnitude, ties_up)  # ... unless the upper neighbour is the even code
    return (code | (torch.signbit(x).to(code.dtype) << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    return table[codes.long()]


def encode_e8m0(exponent: torch.Tensor) -> torch.Tensor:
    """Integer exponents (-127..127) -> E8M0 bytes; 255 (NaN) is never produced."""
    return (exponent.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).to(torch.uint8)


def decode_e8m0(bits: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 powers of two (255 -> NaN, as the format defines)."""
    scale = torch.exp2(bits.float() - E8M0_BIAS)
    return torch.where(bits == 255, torch.nan, scale)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 2n]`` 4-bit codes -> ``[..., n]`` bytes: element 2i low nibble, 2i+1 high."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


# ---------------------------------------------------------------------------- codecs

def _check_matrix(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    if not torch.isfinite(weight).all():
        raise ValueError("the weight has NaN or infinite values")
    return weight.detach().float()


def _row_scales(weight: torch.Tensor, largest: float) -> torch.Tensor:
    """One scale per output row mapping its absmax onto ``largest`` (1 for all-zero rows)."""
    scale = weight.abs().amax(dim=1) / largest
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _blocks(weight: torch.Tensor, block: int) -> torch.Tensor:
    """``[out, in]`` -> ``[out, ceil(in / block), block]``, zero-padded."""
    padded = F.pad(weight, (0, (-weight.shape[1]) % block))
    return padded.view(weight.shape[0], -1, block)


@dataclass(frozen=True)
class Codec:
    """Turns a float weight into named tensors and back; subclasses define one format."""

    name: ClassVar[str]

    def encode(self, weight: torch.Tensor) -> Tensors:
        raise NotImplementedError

    def decode(self, tensors: Tensors, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def decode_for_matmul(
        self, tensors: Tensors, in_features: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, per-output scale or None) with ``decode == weight * scale[:, None]``: a
        per-output-channel scale is cheaper applied to the matmul's output than to the weight."""
        return self.decode(tensors, in_features, dtype), None


@dataclass(frozen=True)
class Fp8Codec(Codec):
    """float8 E4M3 values, one float32 scale per output channel."""

    name: ClassVar[str] = "fp8"

    def encode(self, weight: torch.Tensor) -> Tensors:
        weight = _check_matrix(weight)
        scale = _row_scales(weight, E4M3_MAX)
        return {"qweight": encode_e4m3(weight / scale[:, None]), "scale": scale}

    def decode(self, tensors: Tensors, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        values, scale = self.decode_for_matmul(tensors, in_features, dtype)
        return values * scale[:, None]

    def decode_for_matmul(
        self, tensors: Tensors, in_features: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bits, scale = tensors["qweight"], tensors["scale"].to(dtype)
        if bits.shape[1] % 2:
            return decode_e4m3(bits, dtype), scale
        # two bytes at a time through a 65,536-entry table: ~1.8x faster than the cast on CPU
        index = bits.view(torch.int16).int() & 0xFFFF
        pairs = F.embedding(index, _e4m3_pair_table(dtype, bits.device))
        return pairs.view(bits.shape), scale


@dataclass(frozen=True)
class Mxfp4Codec(Codec):
    """OCP MXFP4: E2M1 pairs per byte, one E8M0 exponent per block of 32 input weights.

    The shared exponent of a block is the format's own rule, ``floor(log2(absmax)) - 2``, or one
    more when that gives a smaller squared error (the rule clips values in [6, 8) x scale to 6 x
    scale); both are valid MXFP4 and decode the same way.
    """

    name: ClassVar[str] = "mxfp4"
    block_size: int = MX_BLOCK

    def encode(self, weight: torch.Tensor) -> Tensors:
        blocks = _blocks(_check_matrix(weight), self.block_size)
        absmax = blocks.abs().amax(dim=2, keepdim=True)
        _, power = torch.frexp(absmax)  # absmax = m * 2**power, 0.5 <= m < 1
        rule = (power - 1 - E2M1_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS - 1)
        best_codes, best_exponent, best_error = None, None, None
        for exponent in (rule, rule + 1):
            scale = torch.exp2(exponent.float())
            codes = encode_e2m1(blocks / scale)
            error = ((decode_e2m1(codes) * scale - blocks) ** 2).sum(dim=2, keepdim=True)
            if best_error is None:
                best_codes, best_exponent, best_error = codes, exponent, error
            else:
                better = error < best_error
                best_codes = torch.where(better, codes, best_codes)
                best_exponent = torch.where(better, exponent, best_exponent)
        rows = weight.shape[0]
        return {"qweight": pack_nibbles(best_codes.view(rows, -1)),
                "scale": encode_e8m0(best_exponent[..., 0])}

    def decode(self, tensors: Tensors, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        packed, exponents = tensors["qweight"], tensors["scale"]
        pairs = F.embedding(packed.int(), _e2m1_pair_table(dtype, packed.device))
        values = pairs.view(packed.shape[0], -1, self.block_size)
        weight = values * decode_e8m0(exponents).to(dtype)[..., None]
        return weight.view(packed.shape[0], -1)[:, :in_features]


@functools.cache
def _e2m1_pair_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """byte -> (value of the low nibble, value of the high nibble): one lookup per byte."""
    return decode_e2m1(unpack_nibbles(torch.arange(256, dtype=torch.uint8, device=device)),
                       dtype).view(256, 2)


@functools.cache
def _e4m3_pair_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """uint16 (two E4M3 bytes in memory order) -> their two values."""
    both = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.uint8)
    return decode_e4m3(both.to(device), dtype).view(65536, 2)


@dataclass(frozen=True)
class Int8Codec(Codec):
    """Symmetric int8, one float32 scale per output row."""

    name: ClassVar[str] = "int8"

    def encode(self, weight: torch.Tensor) -> Tensors:
        weight = _check_matrix(weight)
        scale = _row_scales(weight, 127.0)[:, None]
        return {"qweight": torch.round(weight / scale).clamp(-127, 127).to(torch.int8),
                "scale": scale}

    def decode(self, tensors: Tensors, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        return (tensors["qweight"].float() * tensors["scale"]).to(dtype)


@dataclass(frozen=True)
class Int4Codec(Codec):
    """Symmetric int4 (stored +8 as 0..15), one float32 scale per block of input weights."""

    name: ClassVar[str] = "int4"
    block_size: int = 64

    def encode(self, weight: torch.Tensor) -> Tensors:
        blocks = _blocks(_check_matrix(weight), self.block_size)
        scale = blocks.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 7.0
        codes = torch.round(blocks / scale).clamp(-8, 7).to(torch.int16) + 8
        return {"qweight": pack_nibbles(codes.view(weight.shape[0], -1)), "scale": scale[..., 0]}

    def decode(self, tensors: Tensors, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        packed, scale = tensors["qweight"], tensors["scale"]
        codes = unpack_nibbles(packed).to(torch.int16) - 8
        blocks = codes.view(packed.shape[0], -1, self.block_size).float() * scale[..., None]
        return blocks.view(packed.shape[0], -1)[:, :in_features].to(dtype)


def codec_for(name: str, block_size: int | None = None) -> Codec:
    """The codec called ``name`` (``fp4`` is accepted for ``mxfp4``)."""
    if name == "fp8":
        return Fp8Codec()
    if name in ("fp4", "mxfp4"):
        if block_size not in (None, MX_BLOCK):
            raise ValueError(f"mxfp4 blocks are {MX_BLOCK} weights by definition, not {block_size}")
        return Mxfp4Codec()
    if name == "int8":
        return Int8Codec()
    if name == "int4":
        return Int4Codec(block_size or 64)
    raise ValueError(f"unknown weight format {name!r}: expected fp8, fp4 (mxfp4), int8 or int4")


# ---------------------------------------------------------------------------- embedding tables

EMBEDDING_CODECS = ("bfloat16", "int8", "float32")


def encode_embedding(codec: str, table: torch.Tensor) -> Tensors:
    """A token embedding / output head table ``[rows, dim]`` for the file: suffix -> tensor
    (``""`` the table itself, ``"_scale"`` the per-row scales of ``int8``).

    The table is a fifth of a small model and its rows are read a few at a time (embedding
    lookups, candidate output rows), so 16 or 8 bits per weight cost little in answers."""
    if codec == "int8":
        encoded = Int8Codec().encode(table)
        return {"": encoded["qweight"], "_scale": encoded["scale"].reshape(-1)}
    if codec in ("bfloat16", "float32"):
        return {"": table.detach().to(getattr(torch, codec)).contiguous()}
    raise ValueError(f"embedding codec: expected one of {', '.join(EMBEDDING_CODECS)}, got "
                     f"{codec!r}")


def decode_embedding(codec: str, stored: Tensors, dtype: torch.dtype,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """``stored`` (``weight`` and, for int8, ``scale``) -> the table in ``dtype``; with ``rows``
    only those rows (int8 rows are decoded in float32, then cast once)."""
    weight = stored["weight"] if rows is None else stored["weight"][rows]
    if codec == "int8":
        scale = stored["scale"] if rows is None else stored["scale"][rows]
        return (weight.float() * scale.float()[:, None]).to(dtype)
    if codec in ("bfloat16", "float32"):
        return weight.to(dtype)
    raise ValueError(f"embedding codec: expected one of {', '.join(EMBEDDING_CODECS)}, got "
                     f"{codec!r}")
