"""Key/value rows of every running sequence in one tensor per layer (continuous batching).

The arena is paged: its rows come in blocks of ``BLOCK`` rows, a running sequence holds a block
table (the blocks its positions live in, handed out lowest-first as it grows) and every row
records its owner and position. A step over many sequences is then ONE forward: the new
tokens' keys/values are written into their owners' rows, attention reads the arena's occupied
span as it is (a view, no copy), and the mask ``owner[key] == owner[query] and position[key] <=
position[query]`` lets each query see its own sequence only. Nothing is padded to the longest
sequence, no cache tensor is concatenated per step, and a retired sequence's blocks are reused
at once, so the span stays as short as the rows in use.

Tensors are allocated lazily (first write, once the model's head layout is known) with
``torch.empty``; rows are zeroed when the span first grows over them, so every row a masked
query multiplies by a zero weight holds a finite number.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

BLOCK = 16
FREE = -1
HOLE = -1  # a block-table entry with no block behind it: positions its owner never writes


class KVArena:
    """Per layer, one key and one value tensor of shape ``(1, kv_heads, capacity, head_dim)``."""

    def __init__(self, capacity: int, *, block: int = BLOCK):
        if capacity < block:
            raise ValueError(f"the arena needs at least {block} rows")
        self.block = block
        self.capacity = capacity - capacity % block
        self._free = list(range(self.capacity // block))  # a heap: lowest block first
        self.owner = torch.full((self.capacity,), FREE, dtype=torch.long)
        self.position = torch.zeros(self.capacity, dtype=torch.long)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._clean = 0  # rows below this hold finite numbers

    # ------------------------------------------------------------------ blocks

    @property
    def free_rows(self) -> int:
        return len(self._free) * self.block

    def grow(self, table: list[int], length: int, *, holes_below: int = 0) -> None:
        """Append blocks to ``table`` until it holds ``length`` positions. A new table's
        entries for the blocks wholly below ``holes_below`` are holes: a decision suffix
        writes from its prefix's length on and reads the prefix through its parent's table,
        so 512 one-token suffixes of a 1,000-token prefix take 512 blocks, not 32,768."""
        if not table:
            table.extend([HOLE] * (holes_below // self.block))
        while len(table) * self.block < length:
            if not self._free:
                raise MemoryError("the key/value arena is full")
            table.append(heapq.heappop(self._free))

    def release(self, table: list[int]) -> None:
        for b in table:
            if b == HOLE:
                continue
            self.owner[b * self.block : (b + 1) * self.block] = FREE
            heapq.heappush(self._free, b)
        table.clear()

    def block_rows(self, table: Sequence[int]) -> torch.Tensor:
        """Every arena row of the blocks in ``table`` (holes have none)."""
        blocks = torch.tensor([b for b in table if b != HOLE], dtype=torch.long)
        return (blocks[:, None] * self.block + torch.arange(self.block)).flatten()

    def slots(self, table: Sequence[int], start: int, count: int) -> torch.Tensor:
        """Arena rows of positions ``start .. start + count - 1``."""
        p = torch.arange(start, start + count)
        return torch.tensor(list(table), dtype=torch.long)[p // self.block] * self.block + (
            p % self.block
        )

    # ------------------------------------------------------------------ rows

    def claim(self, slots: torch.Tensor, owner: Any, positions: torch.Tensor) -> None:
        """Rows ``slots`` now hold ``owner``'s (an id, or one per row) ``positions``."""
        self.owner[slots] = owner
        self.position[slots] = positions

    def write(self, table: Sequence[int], owner: int, kv: Any) -> None:
        """Copy a cached prefix's key/values (positions 0..n-1) into the sequence's rows."""
        n = kv[0][0].shape[2]
        slots = self.slots(table, 0, n)
        self.prepare(int(slots.max()) + 1)  # zero what lies below first, never after
        self.claim(slots, owner, torch.arange(n))
        for layer, (k, v) in enumerate(kv):
            keys, values = self._layer(layer, k)
            index = slots.to(keys.device)
            keys.index_copy_(2, index, k.to(keys.dtype))
            values.index_copy_(2, index, v.to(values.dtype))

    def read(self, table: Sequence[int], length: int) -> tuple[tuple[torch.Tensor, ...], ...]:
        """A copy of positions 0..length-1 (for the prefix cache, which must never share rows
        the arena will overwrite)."""
        index = self.slots(table, 0, length)
        return tuple(
            (k.index_select(2, index.to(k.device)), v.index_select(2, index.to(v.device)))
            for k, v in zip(self.keys, self.values)
        )

    def prepare(self, span: int) -> None:
        """Zero the rows that a span reaches for the first time (before anything is written
        there: rows below the watermark are never zeroed again)."""
        if span > self._clean:
            for t in (*self.keys, *self.values):
                t[:, :, self._clean : span].zero_()
            self._clean = span

    def _layer(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.keys) <= layer:
            shape = (1, like.shape[1], self.capacity, like.shape[3])
            keys = torch.empty(shape, dtype=like.dtype, device=like.device)
            values = torch.empty(shape, dtype=like.dtype, device=like.device)
            keys[:, :, : self._clean].zero_()
            values[:, :, : self._clean].zero_()
            self.keys.append(keys)
            self.values.append(values)
        return self.keys[layer], self.values[layer]


class _ArenaLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, arena: KVArena, index: int, slots: torch.Tensor, span: int):
        super().__init__()
        self.arena, self.index, self.slots, self.span = arena, index, slots, span

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.arena._layer(self.index, key_states)
        keys.index_copy_(2, self.slots, key_states.to(keys.dtype))
        values.index_copy_(2, self.slots, value_states.to(values.dtype))
        return keys[:, :, : self.span], values[:, :, : self.span]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.span, 0

    def get_seq_length(self) -> int:
        return self.span

    def get_max_length(self) -> int:
        return self.arena.capacity


class ArenaCache(Cache):
    """A transformers ``Cache`` whose layers write into the arena at explicit rows."""

    def __init__(self, arena: KVArena, slots: torch.Tensor, span: int):
        self._arena, self._slots, self._span = arena, slots, span
        super().__init__(layers=[])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
        *args: Any, **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer_idx:
            self.layers.append(_ArenaLayer(self._arena, len(self.layers), self._slots, self._span))
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._span
