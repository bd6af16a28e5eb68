"""Generation on the llamacpp backend, in the model's one step scheduler.

:class:`~onepass.generate.scheduler.GenerationScheduler` drives a backend through a few calls
(``new_arena``, ``load_prefix``, ``step``, ``vocab_logits``, ``store_prefix``). This module
gives a :class:`~onepass.backends.llamacpp.LlamaCppBackend` those calls, so chat, completions
and responses on a GGUF model run in the same decode loop as on the torch backend: our sampler
(every OpenAI sampling field, seeds, stop strings, logprobs, ``n``), our grammars and our
admission rules, rather than llama.cpp's own sampler chain, which would be a second loop with
other semantics for the same fields.

The sequences live in a second llama.cpp context on the same weights (the first keeps its
sequence 0 for decisions, which clear and restore it freely): each running sequence is one
llama.cpp sequence id, and a step is one ``llama_decode`` of every row's tokens (split by the
batch size), run under the backend's lock so decisions interleave between steps. Prompts
reuse and fill the backend's prefix cache (sequence-state blobs), the decisions' one.
Decision suffixes and readings (prompt scoring, embeddings) are not run here: the engine
scores decisions through the backend's own ``score``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onepass.backends.base import StepRow
from onepass.backends.llamacpp import decode_rows

BLOCK = 16
"""Rows are reserved in blocks of this many tokens (the scheduler's accounting unit)."""


class SequenceArena:
    """The scheduler's arena over the generation context: ``capacity`` KV cells, reserved in
    blocks; a sequence's table holds its llama.cpp sequence id once it has run."""

    block = BLOCK

    def __init__(self, steps: LlamaCppSteps, capacity: int, sequences: int):
        self.steps = steps
        self.capacity = capacity - capacity % BLOCK
        self._free = list(range(sequences))

    def sequence(self, table: list[int]) -> int:
        """The sequence id of ``table`` (a free one taken on first use)."""
        if not table:
            if not self._free:
                raise RuntimeError("every llama.cpp sequence of the generation context is busy")
            table.append(self._free.pop())
        return table[0]

    def release(self, table: list[int]) -> None:
        for seq in table:
            self.steps.forget(seq)
            self._free.append(seq)
        table.clear()


class LlamaCppSteps:
    """The scheduler's backend calls for a llamacpp backend (generation sequences only)."""

    def __init__(self, backend: Any, *, max_sequences: int, context_multiple: int = 2):
        self.backend = backend
        self.max_sequences = max_sequences
        self.context_multiple = context_multiple
        self.context_length = backend.context_length
        self.eos_ids = backend.eos_ids
        self.decode = backend.decode
        self._lc = backend._lc
        self._ctx: Any = None
        self._batch: Any = None

    def new_arena(self, capacity: int) -> SequenceArena:
        """The generation context, sized for ``capacity`` cells at most (llama.cpp allocates
        them up front: ``context_multiple`` full-context sequences by default)."""
        cells = max(self.context_length, min(capacity,
                                             self.context_multiple * self.context_length))
        n_batch = self.backend.n_batch
        self._ctx = self.backend.new_context(cells, n_batch, self.max_sequences)
        self._batch = self._lc.llama_batch_init(n_batch, 0, self.max_sequences)
        return SequenceArena(self, self._ctx.n_ctx(), self.max_sequences)

    def close(self) -> None:
        if self._batch is not None:
            self._lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def forget(self, seq: int) -> None:
        self._lc.llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)

    def load_prefix(self, arena: SequenceArena, table: list[int], owner: int,
                    prompt: Sequence[int], *, keep_last: bool = True,
                    namespace: str | None = None) -> int:
        """Load the longest cached prefix of ``prompt`` into the sequence; returns its length
        (with ``keep_last``, never the whole prompt: its last logits are needed)."""
        if namespace is not None:
            raise ValueError("the llamacpp backend's prefix cache has no namespaces")
        backend = self.backend
        with backend._lock:
            stored, blob = backend.cache.longest_prefix(prompt) if prompt else (0, None)
        if not stored or blob is None:
            return 0
        seq = arena.sequence(table)
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if self._lc.llama_state_seq_set_data(self._ctx.ctx, buf, len(blob), seq) == 0:
            self.forget(seq)
            return 0
        if keep_last and stored == len(prompt):
            stored -= 1
            self._lc.llama_memory_seq_rm(self._ctx.memory, seq, stored, -1)
        return stored

    def store_prefix(self, arena: SequenceArena, table: list[int], prompt: Sequence[int], *,
                     namespace: str | None = None) -> bool:
        """Keep the prompt's sequence state in the backend's prefix cache; False when the
        cache does not take it (or already holds it)."""
        backend = self.backend
        if namespace is not None or not table or not backend.cache.enabled \
                or len(prompt) > backend.cache.max_tokens:
            return False
        with backend._lock:
            if backend._cached(prompt):
                return False
        seq = table[0]
        size = self._lc.llama_state_seq_get_size(self._ctx.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = self._lc.llama_state_seq_get_data(self._ctx.ctx, buf, size, seq)
        with backend._lock:
            return backend.cache.put(prompt, bytes(buf[:written]))

    def step(self, arena: SequenceArena, rows: Sequence[StepRow]) -> list[torch.Tensor | None]:
        """ONE decode of every row's tokens (more only past the batch size); returns, per row
        that asks, its full-vocabulary logits at its last token (the "hidden state" the
        scheduler hands to :meth:`vocab_logits`)."""
        flat: list[tuple[int, int, int, bool]] = []
        ends: dict[int, int] = {}
        for i, row in enumerate(rows):
            if row.parent is not None or row.every:
                raise ValueError("the llamacpp backend runs generation sequences in steps, "
                                 "not decision suffixes or readings")
            seq = arena.sequence(row.table)
            last = len(row.tokens) - 1
            flat += [(t, row.start + k, seq, row.logits and k == last)
                     for k, t in enumerate(row.tokens)]
            if row.logits and row.tokens:
                ends[len(flat) - 1] = i
        out: list[torch.Tensor | None] = [None] * len(rows)
        backend, n_vocab = self.backend, self.backend.vocab_size

        with backend._lock:  # decisions run between steps, never inside one
            for lo in range(0, len(flat), backend.n_batch):
                chunk = flat[lo : lo + backend.n_batch]
                decode_rows(self._lc, self._ctx, self._batch, chunk)
                for j in range(len(chunk)):
                    if lo + j in ends:
                        row = self._lc.llama_get_logits_ith(self._ctx.ctx, j)
                        out[ends[lo + j]] = torch.from_numpy(
                            np.ctypeslib.as_array(row, shape=(n_vocab,)).copy())
        return out

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`step` returned are already full-vocabulary logits."""
        return hidden
