"""Request body → JSON value: size cap, Content-Encoding decoding (capped while decoding),
then strict JSON: no NaN/Infinity tokens (nor numbers that overflow to them), no duplicate
keys, bounded nesting, integers of bounded length and no lone UTF-16 surrogates, so every
route downstream gets values it can convert and encode (each refusal names its JSON path)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from onepass.server.context import log_fields
from onepass.server.encoding import decode_body, parse_content_encoding, read_limited
from onepass.server.errors import ApiError, ClientGone
from onepass.server.settings import ServerSettings

MAX_JSON_DEPTH = 100
BODY_READ_TIMEOUT = 30.0  # a client that trickles its body must not hold a connection forever
# Longer integers are refused here, with their path: past Python's int/str conversion limit
# (4,300 digits) every later int() or str() of one raises ValueError, a 500 wherever it lands.
# Shorter ones that overflow a double are each field's range check (a 4xx naming it).
MAX_INT_DIGITS = sys.int_info.default_max_str_digits
_SURROGATE = re.compile("[\ud800-\udfff]")  # a pair decodes to one character: only lone ones


class _DupDict(dict):
    duplicate: str = ""


class _HugeInt:
    """Stands where an over-long integer was, so the walk can report its path."""

    def __init__(self, digits: int):
        self.digits = digits


class _Overflow:
    """Stands where a number that overflows a double (1e400) was."""


def _int(text: str) -> Any:
    digits = len(text) - text.startswith("-")
    return _HugeInt(digits) if digits > MAX_INT_DIGITS else int(text)


def _float(text: str) -> Any:
    value = float(text)
    return _Overflow() if math.isinf(value) else value


def _reject_constant(name: str) -> Any:
    raise ApiError.of(
        "invalid_json",
        f"invalid JSON: bare {name} is not JSON; send finite numbers "
        "(the official client sends NaN/Infinity as the strings \"NaN\"/\"Infinity\")",
    )


def parse_json(data: bytes) -> Any:
    """Strict JSON: no NaN/Infinity tokens, no duplicate keys, nesting bounded.

    Duplicate keys are refused (400, naming the object and the key) rather than resolved
    last-wins: a client that sends two questions under one name would silently lose one.
    """
    if not data.strip():
        raise ApiError.of("invalid_json", "the request body is empty; expected a JSON object")
    found: list[_DupDict] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        duplicate = None
        for key, value in items:
            if key in obj and duplicate is None:
                duplicate = key
            obj[key] = value
        if duplicate is None:
            return obj
        marked = _DupDict(obj)
        marked.duplicate = duplicate
        found.append(marked)
        return marked

    try:
        value = json.loads(data, object_pairs_hook=pairs, parse_constant=_reject_constant,
                           parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as exc:
        raise ApiError.of(
            "invalid_json",
            f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except UnicodeDecodeError:
        raise ApiError.of("invalid_json", "invalid JSON: the body is not UTF-8 text") from None
    except RecursionError:
        raise _too_deep() from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise _too_deep()
    _check_values(value)
    if found:
        path = _path_to(value, found[0]) or "body"
        raise ApiError.of(
            "duplicate_key",
            f"{path}: the key {found[0].duplicate!r} appears more than once in this object; "
            "each key may appear once (a repeated question name would silently replace the "
            "first question)",
            field=path,
        )
    return value


def _too_deep() -> ApiError:
    return ApiError.of(
        "invalid_json", f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    )


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((c, d + 1) for c in children)
    return deepest


def _check_values(root: Any) -> None:
    """Refuse (400, naming the JSON path) an over-long integer, a number that overflows to
    infinity, or a string (value or key) holding a lone surrogate, which no UTF-8 encoder
    (tokenizer, log line, response) accepts."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and _SURROGATE.search(node):
                _refuse(root, node, "the string holds a lone UTF-16 surrogate (such as "
                        "\\ud800 without its pair), which is not text; send valid Unicode")
        elif isinstance(node, _HugeInt):
            _refuse(root, node, f"an integer of {node.digits} digits is over the limit of "
                    f"{MAX_INT_DIGITS} digits")
        elif isinstance(node, _Overflow):
            _refuse(root, node, "the number is outside the range of a double (it would be "
                    "Infinity)")
        elif isinstance(node, dict):
            for key in node:
                if not key.isascii() and _SURROGATE.search(key):
                    _refuse(root, node, f"the key {key[:40]!r} holds a lone UTF-16 surrogate, "
                            "which is not text; send valid Unicode")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _refuse(root: Any, target: Any, why: str) -> None:
    path = _path_to(root, target) or "body"
    raise ApiError.of("invalid_json", f"{path}: {why}", field=path)


def _path_to(root: Any, target: Any) -> str | None:
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return None


async def read_json(request: Request, settings: ServerSettings,
                    parse: Callable[[Any], Any] | None = None) -> Any:
    """The decoded, parsed body of an API request (all client faults are 4xx), given to
    ``parse`` (the route's validation) when one is named, whose result is returned.

    Only reading the body runs on the event loop; decoding, strict JSON and ``parse`` run in
    one worker thread for every body: each costs CPU that grows with the body (at the 2 MB
    cap: ~1 s of JSON, ~0.5 s of contract checks; 64 KB of ``{}`` objects: 0.1-0.2 s of
    strict checks) and, on the loop, would hold every other request, ``/health/live`` too."""
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("multipart/"):
        raise ApiError.of(
            "unsupported_asset",
            "multipart bodies carry image assets, which need a vision-language model; this "
            "server serves text-only models: send application/json without images",
            field="content-type",
        )
    codings = parse_content_encoding(request.headers.get("content-encoding"))
    try:
        raw = await asyncio.wait_for(
            read_limited(
                request.stream(), settings.max_body_bytes, request.headers.get("content-length")
            ),
            BODY_READ_TIMEOUT,
        )
    except ClientDisconnect:
        raise ClientGone() from None
    except asyncio.TimeoutError:
        raise ApiError.of(
            "request_timeout",
            f"the request body did not arrive within {BODY_READ_TIMEOUT:g} s",
        ) from None

    fields = log_fields(request)
    fields["body_bytes"] = len(raw)
    if codings:
        fields["encoding"] = ",".join(codings)

    def decode_and_parse() -> Any:
        data = decode_body(raw, codings, settings.max_body_bytes)
        if codings:
            fields["decoded_bytes"] = len(data)
        value = parse_json(data)
        return value if parse is None else parse(value)

    return await asyncio.to_thread(decode_and_parse)
