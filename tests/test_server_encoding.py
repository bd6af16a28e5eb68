"""Request-body decoding: every supported coding round-trips, bombs stop at the cap without
being inflated, corrupt or truncated data is refused (never silently shortened)."""

from __future__ import annotations

import asyncio
import gzip
import time
import tracemalloc
import zlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from onepass.server.encoding import (
    decode_body,
    parse_content_encoding,
    read_limited,
)
from onepass.server.errors import ApiError

LIMIT = 1 << 20


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


def zstd_stream(data: bytes) -> bytes:
    """A zstd frame without the content size in its header (streaming compression)."""
    c = zstandard.ZstdCompressor().compressobj()
    return c.compress(data) + c.flush()


ENCODERS = {
    "zstd": zstandard.ZstdCompressor().compress,
    "zstd-stream": zstd_stream,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate-raw": raw_deflate,
}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_round_trip(name):
    data = b'{"state": "caf\xc3\xa9", "questions": {}}' * 500
    coding = name.split("-")[0]
    assert decode_body(ENCODERS[name](data), [coding], LIMIT) == data


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4000), name=st.sampled_from(sorted(ENCODERS)))
def test_round_trip_any_bytes(data, name):
    coding = name.split("-")[0]
    assert decode_body(ENCODERS[name](data), [coding], LIMIT) == data


def test_concatenated_frames_and_members():
    a, b = b"first;", b"second"
    z = zstandard.ZstdCompressor()
    assert decode_body(z.compress(a) + z.compress(b), ["zstd"], LIMIT) == a + b
    assert decode_body(gzip.compress(a) + gzip.compress(b), ["gzip"], LIMIT) == a + b


def test_stacked_codings_are_undone_in_reverse_order():
    data = b"x" * 5000
    body = zstandard.ZstdCompressor().compress(gzip.compress(data))
    assert decode_body(body, parse_content_encoding("gzip, zstd"), LIMIT) == data


def _bomb_zstd(size: int, with_size: bool) -> bytes:
    if with_size:
        return zstandard.ZstdCompressor(level=3).compress(bytes(size))
    c = zstandard.ZstdCompressor(level=3).compressobj()
    chunk = bytes(1 << 22)
    return b"".join(c.compress(chunk) for _ in range(size // len(chunk))) + c.flush()


@pytest.mark.parametrize(
    "coding,body",
    [
        ("zstd", _bomb_zstd(256 << 20, with_size=False)),  # no size in the header
        ("zstd", _bomb_zstd(64 << 20, with_size=True)),  # refused from the header
        ("gzip", gzip.compress(bytes(64 << 20), mtime=0)),
        ("deflate", zlib.compress(bytes(64 << 20))),
    ],
    ids=["zstd-streaming", "zstd-sized", "gzip", "deflate"],
)
def test_bomb_stops_at_the_cap_without_inflating(coding, body):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ApiError) as err:
            decode_body(body, [coding], LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.status == 413
    assert "over the limit of 1048576 bytes" in err.value.message
    assert peak < 16 * LIMIT, f"decoding allocated {peak} bytes"  # not the 64-256 MiB bomb
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "coding,body,why",
    [
        ("zstd", zstandard.ZstdCompressor().compress(b"x" * 1000)[:-4], "truncated"),
        ("zstd", b"this is not zstd", "no zstd frame header"),
        ("zstd", b"", "empty body"),
        # mtime=0: these bytes are the test id, which both xdist workers must collect alike
        ("gzip", gzip.compress(b"x" * 1000, mtime=0)[:-6], "truncated"),
        ("gzip", b"plain text", "incorrect header check"),
        ("deflate", zlib.compress(b"x" * 100) + b"junk", "trailing bytes"),
        ("deflate", zlib.compress(b"x" * 1000)[:-5], "truncated"),
    ],
)
def test_corrupt_or_truncated_is_400(coding, body, why):
    with pytest.raises(ApiError) as err:
        decode_body(body, [coding], LIMIT)
    assert err.value.status == 400
    assert err.value.kind == "invalid_encoding"
    assert why in err.value.message and coding in err.value.message


@pytest.mark.parametrize("header", ["br", "compress", "zstd, br", "x-custom"])
def test_unknown_encoding_is_415(header):
    with pytest.raises(ApiError) as err:
        parse_content_encoding(header)
    assert err.value.status == 415
    assert "not supported" in err.value.message and "zstd" in err.value.message


def test_identity_and_aliases():
    assert parse_content_encoding(None) == []
    assert parse_content_encoding("identity") == []
    assert parse_content_encoding(" ZSTD ") == ["zstd"]
    assert parse_content_encoding("x-gzip") == ["gzip"]


async def _chunks(parts):
    for p in parts:
        yield p


def test_raw_cap_by_header_and_by_stream():
    with pytest.raises(ApiError) as err:
        asyncio.run(read_limited(_chunks([b"x"]), 10, content_length="11"))
    assert err.value.status == 413
    with pytest.raises(ApiError) as err:
        asyncio.run(read_limited(_chunks([b"x" * 6, b"x" * 6]), 10))
    assert err.value.status == 413
    assert asyncio.run(read_limited(_chunks([b"ab", b"cd"]), 10, "4")) == b"abcd"
    with pytest.raises(ApiError) as err:
        asyncio.run(read_limited(_chunks([]), 10, content_length="ten"))
    assert err.value.status == 400
