"""Batch-invariant attention over groups of queries (registered with transformers as "onepass").

The backend packs unrelated work into one forward: a prefix with its question suffixes, the
next token of every running stream, a prompt chunk beside them. Every such forward passes
:class:`Segments` to the decoder: groups of queries, each with the key rows it may read in
position order (key ``i`` of a group is position ``i`` of its sequence). Each query's output is
then a function of its position, its query vector and its visible keys only, never of what
else the forward holds: a prefix read from the cache, a suffix among 16 others, a prompt
prefilled in chunks and a greedy token decoded beside other streams compute bit-identical
numbers to the same prompt alone on a cold cache (the decoder's linears are row-invariant
from 2 rows on, which backends/rows.py's ``pad_short_rows`` guarantees: measured,
tests/test_invariance.py).

torch's CPU attention kernel splits queries and keys by sizes that follow the shapes it is
given, and in bfloat16 rounds each key block's probabilities, so the same query read other
last bits beside other queries or keys (and, rounded into bfloat16 activations, other answers
30 layers later). Here every call the kernel sees has a shape fixed by position alone:

* a prompt position ``p`` (prefill, decisions, readings) is computed in the block of
  :data:`BLOCK` positions holding it, as row ``p % BLOCK`` of a :data:`BLOCK`-row query against
  exactly the keys of positions ``0 .. BLOCK * (p // BLOCK + 1) - 1``; rows of the block this
  forward does not compute are padding, keys past ``p`` are masked (they weigh exactly zero
  whatever they hold);
* a generated position (``decode``: one token of a running stream) is row 0 of a
  :data:`DECODE_ROWS`-row query against the keys of positions ``0 .. p``, their count rounded
  up to :data:`DECODE_KEYS` (the rest masked).

Blocks with the same key count, from any groups, run as one batched call. Without segments
(training, calibration) the function is transformers' sdpa attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "onepass"
BLOCK = 32  # query rows per prefill block (below torch's first split-size change, 192)
DECODE_KEYS = 128  # a generated token's key count: its position + 1, rounded up to this
DECODE_ROWS = 4  # a generated token is row 0 of this many (one row takes other, slower paths)
BATCH_KEY_ROWS = 1 << 17  # key rows gathered per call (x kv heads x head dim x 2 tensors)


@dataclass(frozen=True)
class Segment:
    """Queries ``q_lo:q_hi`` of the forward at positions ``query_pos``, reading ``keys``:
    ``keys[i]`` is the forward's key row of position ``i`` of their sequence. Each query sees
    the positions up to its own. ``decode``: one generated token of a running stream."""

    q_lo: int
    q_hi: int
    keys: torch.Tensor
    query_pos: torch.Tensor
    decode: bool = False

    @classmethod
    def causal(cls, q_lo: int, keys: torch.Tensor, query_pos: torch.Tensor,
               decode: bool = False) -> Segment:
        return cls(q_lo, q_lo + len(query_pos), keys, query_pos, decode)


@dataclass
class _Call:
    """Blocks with the same shape (rows x keys), run as one batched kernel call."""

    rows: int
    keys: int
    query_index: torch.Tensor  # (blocks * rows,) forward query rows (padding repeats one)
    key_index: torch.Tensor | slice  # (blocks * keys,) forward key rows, or one range
    query_pos: torch.Tensor  # (blocks, rows); padding rows at -1
    real: torch.Tensor  # indices of the real rows among blocks * rows
    dest: torch.Tensor  # their forward query rows
    masks: dict[Any, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """(blocks, 1, rows, keys) bool: causal, within ``window`` on sliding layers."""
        key = (window, device)
        if key not in self.masks:
            key_pos = torch.arange(self.keys)
            query_pos = self.query_pos[:, :, None]
            ok = key_pos[None, None, :] <= query_pos
            if window is not None:
                ok = ok & (key_pos[None, None, :] > query_pos - window)
            ok[:, :, 0] |= self.query_pos < 0  # a padding row reads position 0, never nothing
            self.masks[key] = ok[:, None].to(device)
        return self.masks[key]

    def to(self, device: torch.device) -> _Call:
        if self.query_index.device == device:
            return self
        keys = self.key_index if isinstance(self.key_index, slice) else self.key_index.to(device)
        return _Call(self.rows, self.keys, self.query_index.to(device), keys, self.query_pos,
                     self.real.to(device), self.dest.to(device), self.masks)


class Segments:
    """The groups of one forward, planned once into kernel calls and reused by every layer."""

    def __init__(self, items: list[Segment]):
        self.items = items
        self._plans: dict[torch.device, list[_Call]] = {}

    def plan(self, device: torch.device) -> list[_Call]:
        if device not in self._plans:
            self._plans[device] = [c.to(device) for c in _plan(self.items)]
        return self._plans[device]


def _plan(items: list[Segment]) -> list[_Call]:
    """Cut every group into position blocks (prefill) or single rows (decode) and gather the
    blocks of each shape into calls."""
    shapes: dict[tuple[int, int], list[tuple[Segment, int, int, int]]] = {}
    for seg in items:
        pos = seg.query_pos.tolist()
        if seg.decode:
            for i, p in enumerate(pos):
                shapes.setdefault((DECODE_ROWS, _round(p + 1, DECODE_KEYS)), []).append(
                    (seg, i, i + 1, p))
            continue
        i = 0
        while i < len(pos):  # consecutive rows of one block
            first = pos[i] - pos[i] % BLOCK
            j = i
            while j < len(pos) and first <= pos[j] < first + BLOCK:
                j += 1
            shapes.setdefault((BLOCK, first + BLOCK), []).append((seg, i, j, first))
            i = j
    calls = []
    for (rows, keys), members in sorted(shapes.items(), key=lambda kv: kv[0][1]):
        per = max(1, BATCH_KEY_ROWS // keys)
        for start in range(0, len(members), per):
            calls.append(_call(members[start:start + per], rows, keys))
    return calls


def _round(n: int, step: int) -> int:
    return -(-n // step) * step


def _call(members: list[tuple[Segment, int, int, int]], rows: int, keys: int) -> _Call:
    count = len(members)
    query_index = torch.empty(count, rows, dtype=torch.long)
    key_index = torch.empty(count, keys, dtype=torch.long)
    query_pos = torch.full((count, rows), -1, dtype=torch.long)
    real, dest = [], []
    for b, (seg, i, j, first) in enumerate(members):
        offsets = seg.query_pos[i:j] - first  # each row sits at its position in the block
        forward_rows = torch.arange(seg.q_lo + i, seg.q_lo + j)
        query_index[b] = forward_rows[0]
        query_index[b, offsets] = forward_rows
        query_pos[b, offsets] = seg.query_pos[i:j]
        have = min(keys, len(seg.keys))
        key_index[b, :have] = seg.keys[:have]
        key_index[b, have:] = seg.keys[0]  # past the last position: masked
        real.append(b * rows + offsets)
        dest.append(forward_rows)
    flat = key_index.flatten()
    contiguous = count == 1 and torch.equal(flat, torch.arange(int(flat[0]),
                                                              int(flat[0]) + keys))
    return _Call(rows, keys, query_index.flatten(),
                 slice(int(flat[0]), int(flat[0]) + keys) if contiguous else flat,
                 query_pos, torch.cat(real), torch.cat(dest))


def _gather(tensor: torch.Tensor, index: torch.Tensor | slice, blocks: int) -> torch.Tensor:
    """(heads, rows, dim) -> (blocks, heads, rows / blocks, dim)."""
    if isinstance(index, slice):
        return tensor[None, :, index]
    picked = tensor.index_select(1, index)
    return picked.view(tensor.shape[0], blocks, -1, tensor.shape[-1]).transpose(0, 1)


def packed_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: Any, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    segments: Segments | None = kwargs.pop("onepass_segments", None)
    if segments is None or kwargs.get("s_aux") is not None or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    window = getattr(module, "sliding_window", None)
    q, k, v = query[0], key[0], value[0]
    gqa = q.shape[0] != k.shape[0]
    out = query.new_empty((q.shape[1], q.shape[0], v.shape[-1]))
    for call in segments.plan(query.device):
        blocks = len(call.query_index) // call.rows
        rows = F.scaled_dot_product_attention(
            _gather(q, call.query_index, blocks), _gather(k, call.key_index, blocks),
            _gather(v, call.key_index, blocks), attn_mask=call.mask(window, query.device),
            scale=kwargs.get("scaling"), enable_gqa=gqa,
        )  # (blocks, heads, rows, dim)
        flat = rows.transpose(1, 2).reshape(blocks * call.rows, q.shape[0], -1)
        out.index_copy_(0, call.dest, flat.index_select(0, call.real))
    return out[None], None


AttentionInterface.register(NAME, packed_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
