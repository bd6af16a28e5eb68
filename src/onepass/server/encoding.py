"""Request bodies: read with a byte cap, then decode ``Content-Encoding`` with a cap on the
decoded size that is checked while decoding.

The official client sends every body of 1 KiB or more as ``Content-Encoding: zstd``; gzip and
deflate are accepted as a courtesy. A compression bomb never gets inflated: a zstd frame that
declares a content size over the cap is refused from its header, and every decoder produces
output in bounded steps, stopping as soon as the running total passes the cap. Corrupt or
truncated data is a 400 (never silently shortened); an unknown coding is a 415.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import zstandard

from onepass.limits import body_too_large
from onepass.server.errors import ApiError

SUPPORTED = ("zstd", "gzip", "deflate", "identity")
_ALIASES = {"x-gzip": "gzip"}
_STEP = 64 * 1024  # decoded bytes produced per zlib step
_ZSTD_PIECE = 128  # compressed bytes fed per zstd step: at most 32 blocks (4 MiB) of output


def too_large(limit: int, what: str = "request body") -> ApiError:
    err = body_too_large(limit, what)
    return ApiError.of(err.kind, err.message)


def parse_content_encoding(header: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` header in the order they were applied.

    ``identity`` is dropped; anything outside :data:`SUPPORTED` is a 415.
    """
    if not header:
        return []
    codings = []
    for part in header.split(","):
        name = part.strip().lower()
        name = _ALIASES.get(name, name)
        if not name or name == "identity":
            continue
        if name not in SUPPORTED:
            raise ApiError.of(
                "unsupported_encoding",
                f"Content-Encoding {part.strip()!r} is not supported; "
                "send zstd, gzip, deflate or an uncompressed body",
                field="content-encoding",
                headers={"accept-encoding": "zstd, gzip, deflate"},
            )
        codings.append(name)
    if len(codings) > 3:
        raise ApiError.of(
            "unsupported_encoding",
            "Content-Encoding lists more than 3 codings",
            field="content-encoding",
        )
    return codings


async def read_limited(
    chunks: AsyncIterator[bytes], limit: int, content_length: str | None = None
) -> bytes:
    """The raw body, refused with 413 as soon as it (or its declared length) passes ``limit``."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise ApiError.of(
                "invalid_request_error",
                f"Content-Length {content_length!r} is not a number",
                field="content-length",
            ) from None
        if declared > limit:
            raise too_large(limit)
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def _bad(coding: str, why: str) -> ApiError:
    return ApiError.of(
        "invalid_encoding",
        f"the body is not valid {coding} data ({why}); it was sent with Content-Encoding: {coding}",
        field="content-encoding",
    )


def decode_zstd(data: bytes, limit: int) -> bytes:
    """Decode one or more concatenated zstd frames, never producing more than ``limit`` bytes
    (plus one bounded step)."""
    out: list[bytes] = []
    total = 0
    rest = memoryview(data)
    if not rest:
        raise _bad("zstd", "empty body")
    while rest:
        try:
            declared = zstandard.frame_content_size(bytes(rest[:18]))
        except zstandard.ZstdError:
            raise _bad("zstd", "no zstd frame header") from None
        if declared > limit - total:  # -1 (unknown) passes; the running check applies
            raise too_large(limit, "decoded request body")
        d = zstandard.ZstdDecompressor().decompressobj()
        pos = 0
        try:
            while pos < len(rest) and not d.eof:
                piece = d.decompress(bytes(rest[pos : pos + _ZSTD_PIECE]))
                pos += _ZSTD_PIECE
                total += len(piece)
                if total > limit:
                    raise too_large(limit, "decoded request body")
                out.append(piece)
        except zstandard.ZstdError as exc:
            raise _bad("zstd", str(exc)) from None
        if not d.eof:
            raise _bad("zstd", "the frame is truncated")
        consumed = min(pos, len(rest)) - len(d.unused_data)
        rest = rest[consumed:]
    return b"".join(out)


def decode_zlib(data: bytes, limit: int, coding: str) -> bytes:
    """gzip (one or more members) or deflate (zlib-wrapped, or raw as some clients send it)."""
    if not data:
        raise _bad(coding, "empty body")
    out: list[bytes] = []
    total = 0
    rest = data
    while rest:
        if coding == "gzip":
            wbits = 16 + zlib.MAX_WBITS
        else:
            zlib_header = (
                len(rest) >= 2 and rest[0] & 0x0F == 8 and (rest[0] << 8 | rest[1]) % 31 == 0
            )
            wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        d = zlib.decompressobj(wbits)
        pending = rest
        try:
            while True:
                piece = d.decompress(pending, _STEP)
                pending = d.unconsumed_tail
                total += len(piece)
                if total > limit:
                    raise too_large(limit, "decoded request body")
                out.append(piece)
                if d.eof or (not piece and not pending):
                    break
        except zlib.error as exc:
            raise _bad(coding, str(exc)) from None
        if not d.eof:
            raise _bad(coding, "the stream is truncated")
        rest = d.unused_data
        if rest and coding != "gzip":
            raise _bad(coding, "trailing bytes after the end of the stream")
    return b"".join(out)


def decode_body(data: bytes, codings: list[str], limit: int) -> bytes:
    """Undo ``codings`` (in the order they were applied) with ``limit`` on every stage."""
    for coding in reversed(codings):
        data = decode_zstd(data, limit) if coding == "zstd" else decode_zlib(data, limit, coding)
    if len(data) > limit:
        raise too_large(limit, "decoded request body")
    return data
