"""A bounded, thread-safe LRU of computed prefixes, keyed by their exact token ids.

Values are opaque to the cache (a backend stores its key/value tensors there) and are never
mutated once stored: a backend builds new tensors on top of a cached prefix, it never writes
into one. Limits are by entry count and by total resident tokens; either at 0 disables the
cache. ``longest_prefix`` lets a request reuse any cached entry its tokens start with (a
system context, the previous step of a sequential decision).

A ``namespace`` partitions the entries (the OpenAI Decisions ``prompt_cache_key``): an entry
stored under one namespace is found only by lookups in the same namespace (None is a namespace
of its own: requests without a key). Pinned entries (the start-up system prompt, no caller's
data) are found from every namespace. The bounds are shared by all namespaces.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class CacheStats:
    hits: int = 0
    partial_hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    resident_tokens: int = 0


class PrefixCache(Generic[V]):
    def __init__(self, max_entries: int = 16, max_tokens: int = 32768):
        if max_entries < 0 or max_tokens < 0:
            raise ValueError("cache limits must be >= 0")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        # (namespace, token ids) -> value
        self._items: OrderedDict[tuple[str | None, tuple[int, ...]], V] = OrderedDict()
        self._pinned: dict[tuple[int, ...], V] = {}
        self._tokens = 0
        self._lock = threading.Lock()
        self._stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_tokens > 0

    def stats(self) -> CacheStats:
        with self._lock:
            s = self._stats
            return CacheStats(
                s.hits, s.partial_hits, s.misses, s.evictions, len(self._items), self._tokens
            )

    def pin(self, tokens: Sequence[int], value: V) -> None:
        """Keep ``value`` for ``tokens`` outside the LRU bounds (a start-up system context)."""
        with self._lock:
            self._pinned[tuple(tokens)] = value

    def longest_prefix(
        self, tokens: Sequence[int], namespace: str | None = None
    ) -> tuple[int, V | None]:
        """The longest stored entry of ``namespace`` (or pinned one) that ``tokens`` starts
        with: (its length, value)."""
        key = tuple(tokens)
        with self._lock:
            if (namespace, key) in self._items:
                self._items.move_to_end((namespace, key))
                self._stats.hits += 1
                return len(key), self._items[(namespace, key)]
            if key in self._pinned:
                self._stats.hits += 1
                return len(key), self._pinned[key]
            best_len, best = 0, None
            own = ((k, v) for (ns, k), v in self._items.items() if ns == namespace)
            for stored, value in itertools.chain(own, self._pinned.items()):
                n = len(stored)
                if best_len < n < len(key) and key[:n] == stored:
                    best_len, best = n, value
            if best is not None:
                self._stats.partial_hits += 1
                for ns, stored in self._items:
                    if ns == namespace and len(stored) == best_len \
                            and key[:best_len] == stored:
                        self._items.move_to_end((ns, stored))
                        break
            else:
                self._stats.misses += 1
            return best_len, best

    def put(self, tokens: Sequence[int], value: V, namespace: str | None = None) -> bool:
        """Store ``value`` for ``tokens`` in ``namespace``; False when the cache is off or the
        entry is over the token bound (nothing stored)."""
        key = (namespace, tuple(tokens))
        if not self.enabled or len(key[1]) > self.max_tokens:
            return False
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return True
            self._items[key] = value
            self._tokens += len(key[1])
            while len(self._items) > self.max_entries or self._tokens > self.max_tokens:
                (_, old), _ = self._items.popitem(last=False)
                self._tokens -= len(old)
                self._stats.evictions += 1
            return True

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._tokens = 0

