import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from onepass.cache import PrefixCache


def test_exact_hit_and_miss_counts():
    cache = PrefixCache(4, 100)
    assert cache.longest_prefix([1, 2, 3]) == (0, None)
    cache.put([1, 2, 3], "abc")
    assert cache.longest_prefix([1, 2, 3]) == (3, "abc")
    s = cache.stats()
    assert (s.hits, s.misses, s.entries, s.resident_tokens) == (1, 1, 1, 3)


def test_longest_prefix_picks_the_longest_stored_prefix():
    cache = PrefixCache(4, 100)
    cache.put([1, 2], "short")
    cache.put([1, 2, 3, 4], "long")
    cache.put([9, 9, 9], "other")
    assert cache.longest_prefix([1, 2, 3, 4, 5]) == (4, "long")
    assert cache.longest_prefix([1, 2, 7]) == (2, "short")
    assert cache.longest_prefix([1, 3]) == (0, None)
    assert cache.stats().partial_hits == 2


def test_entry_bound_evicts_least_recently_used():
    cache = PrefixCache(2, 100)
    cache.put([1], "a")
    cache.put([2], "b")
    cache.longest_prefix([1])  # touch a: b is now the oldest
    cache.put([3], "c")
    assert cache.longest_prefix([2]) == (0, None)
    assert cache.longest_prefix([1]) == (1, "a")
    assert cache.stats().evictions == 1


def test_token_bound_evicts_until_under_budget():
    cache = PrefixCache(10, 10)
    cache.put(list(range(6)), "a")
    cache.put(list(range(100, 106)), "b")
    s = cache.stats()
    assert s.entries == 1 and s.resident_tokens == 6 and s.evictions == 1
    cache.put(list(range(50)), "too big")  # larger than the whole budget: not stored
    assert cache.stats().resident_tokens == 6


@pytest.mark.parametrize("entries,tokens", [(0, 100), (10, 0)])
def test_zero_disables(entries, tokens):
    cache = PrefixCache(entries, tokens)
    cache.put([1, 2], "x")
    assert cache.longest_prefix([1, 2]) == (0, None)
    assert not cache.enabled


def test_pinned_entries_survive_eviction():
    cache = PrefixCache(1, 100)
    cache.pin([7, 7], "system")
    cache.put([1], "a")
    cache.put([2], "b")
    assert cache.longest_prefix([7, 7, 1]) == (2, "system")


def test_values_are_not_copied_or_mutated_by_the_cache():
    cache = PrefixCache(4, 100)
    value = ("k", "v")
    cache.put([1, 2], value)
    _, got = cache.longest_prefix([1, 2])
    assert got is value


def test_thread_safety_under_concurrent_use():
    cache = PrefixCache(8, 64)
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        start.wait()  # all at once: the races need contention
        for i in range(400):
            key = [seed, i % 13, i % 5]
            cache.put(key, tuple(key))
            n, v = cache.longest_prefix(key + [0])
            assert v is None or list(v) == key[:n]
            s = cache.stats()
            assert s.entries <= 8 and s.resident_tokens <= 64

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(worker, t) for t in range(8)]
    # every exception a thread raised, not only AssertionError: a race shows as a KeyError or
    # a RuntimeError as often as a failed assertion
    failures = [f.exception() for f in futures if f.exception() is not None]
    if failures:
        raise AssertionError(f"{len(failures)} of 8 threads failed: {failures!r}") from failures[0]
    s = cache.stats()
    assert s.entries <= 8 and s.resident_tokens == 3 * s.entries


def test_namespaces_partition_entries_and_share_pinned_ones():
    cache = PrefixCache(8, 100)
    cache.pin([1, 2], "system")
    assert cache.put([1, 2, 3, 4], "a", "key-a")
    assert cache.longest_prefix([1, 2, 3, 4], "key-a") == (4, "a")
    assert cache.longest_prefix([1, 2, 3, 4, 5], "key-a") == (4, "a")
    # another key, and no key, see only the pinned system entry
    assert cache.longest_prefix([1, 2, 3, 4], "key-b") == (2, "system")
    assert cache.longest_prefix([1, 2, 3, 4]) == (2, "system")
    cache.put([1, 2, 3, 4], "b", "key-b")
    assert cache.longest_prefix([1, 2, 3, 4], "key-b") == (4, "b")
    assert cache.longest_prefix([1, 2, 3, 4], "key-a") == (4, "a")
    assert cache.stats().entries == 2 and cache.stats().resident_tokens == 8


def test_put_says_whether_it_stored():
    assert not PrefixCache(0, 100).put([1], "x")
    assert not PrefixCache(4, 2).put([1, 2, 3], "x")
    assert PrefixCache(4, 100).put([1, 2, 3], "x")
