"""Attention per group inside one packed forward (registered with transformers as "onepass").

A step packs the tokens of unrelated requests into one forward, so the weight matmuls run once
for all of them. Dense attention over the packed keys would then score every query against
every other request's keys only to mask them out: on a prefill-heavy step that wasted work
grows with the square of the packed length. With :class:`Segments` passed to the decoder, each
group of queries (one sequence, or one decision's prefix and suffixes) attends only to its own
key rows; without them the function is transformers' own sdpa attention, so every other path
(decisions' packed forward, the naive reference) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "onepass"


@dataclass(frozen=True)
class Segment:
    """Queries ``q_lo:q_hi`` of the packed step and the arena rows they may read."""

    q_lo: int
    q_hi: int
    keys: torch.Tensor  # row indices into the step's key span
    contiguous: bool
    allowed: torch.Tensor  # (q_hi - q_lo, len(keys)) bool, causal and owner rules applied
    key_pos: torch.Tensor
    query_pos: torch.Tensor

    def mask(self, window: int | None) -> torch.Tensor:
        if window is None:
            return self.allowed
        return self.allowed & (self.key_pos[None, :] > self.query_pos[:, None] - window)


class Segments:
    """The groups of one step, with per-window masks made once per step (not per layer)."""

    def __init__(self, items: list[Segment]):
        self.items = items
        self._masks: dict[int | None, list[torch.Tensor]] = {}

    def masks(self, window: int | None, device: torch.device) -> list[torch.Tensor]:
        if window not in self._masks:
            self._masks[window] = [s.mask(window)[None, None].to(device) for s in self.items]
        return self._masks[window]


def packed_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: Any, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    segments: Segments | None = kwargs.pop("onepass_segments", None)
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    window = getattr(module, "sliding_window", None)
    out = torch.empty_like(query)
    for seg, mask in zip(segments.items, segments.masks(window, query.device)):
        if seg.contiguous:
            lo, hi = int(seg.keys[0]), int(seg.keys[-1]) + 1
            k, v = key[:, :, lo:hi], value[:, :, lo:hi]
        else:
            index = seg.keys.to(key.device)
            k, v = key.index_select(2, index), value.index_select(2, index)
        out[:, :, seg.q_lo : seg.q_hi] = F.scaled_dot_product_attention(
            query[:, :, seg.q_lo : seg.q_hi], k, v, attn_mask=mask,
            scale=kwargs.get("scaling"), enable_gqa=query.shape[1] != k.shape[1],
        )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, packed_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
