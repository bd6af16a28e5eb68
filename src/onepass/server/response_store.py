"""Stored Responses (``store: true``): a process-local LRU bounded by entries, bytes and age.

Storage is opt-in and lost on restart. Each bound evicts the least recently used entries; an
expired entry is never returned (404 to the client, exactly like an unknown id). It is separate
from the model's prefix cache: storing a response keeps its text, not its keys/values.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ENTRIES = 256
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_AGE = 3600.0


@dataclass(frozen=True)
class Stored:
    """One stored response: the object GET returns, the served model it came from, its own
    input items (GET .../input_items), and the conversation so far as chat messages (what a
    follow-up with ``previous_response_id`` continues)."""

    response: dict[str, Any]
    model: str
    input_items: list[dict[str, Any]]
    history: list[dict[str, str]]

    def size(self) -> int:
        """Bytes as JSON: the measure the byte bound counts."""
        return len(json.dumps([self.response, self.input_items, self.history],
                              ensure_ascii=False).encode())


class ResponseStore:
    """Thread-safe LRU of :class:`Stored` by response id."""

    def __init__(
        self, *, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES,
        max_age: float = DEFAULT_MAX_AGE, clock: Callable[[], float] = time.monotonic,
    ):
        if max_entries < 1 or max_bytes < 1 or not max_age > 0:
            raise ValueError("max_entries, max_bytes and max_age must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._clock = clock
        self._entries: OrderedDict[str, tuple[Stored, int, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, rid: str, entry: Stored) -> bool:
        """Store ``entry``, evicting the least recently used to fit; False (nothing stored)
        when it alone is over the byte bound."""
        size = entry.size()
        if size > self.max_bytes:
            return False
        with self._lock:
            self._drop(rid)
            self._expire()
            while self._entries and (len(self._entries) >= self.max_entries
                                     or self._bytes + size > self.max_bytes):
                self._drop(next(iter(self._entries)))
            self._entries[rid] = (entry, size, self._clock())
            self._bytes += size
        return True

    def get(self, rid: str) -> Stored | None:
        """The entry (now the most recently used), or None if unknown, evicted or expired."""
        with self._lock:
            self._expire()
            found = self._entries.get(rid)
            if found is None:
                return None
            self._entries.move_to_end(rid)
            return found[0]

    def delete(self, rid: str) -> bool:
        with self._lock:
            self._expire()
            return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        found = self._entries.pop(rid, None)
        if found is None:
            return False
        self._bytes -= found[1]
        return True

    def _expire(self) -> None:
        """Age is counted from storing, not from the last read: one hour means one hour."""
        cutoff = self._clock() - self.max_age
        for rid in [r for r, (_, _, at) in self._entries.items() if at <= cutoff]:
            self._drop(rid)
