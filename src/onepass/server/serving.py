"""What every decision route does around the engine: its checks off the event loop, the
bounded queue, contract faults mapped to statuses, metrics and access-log fields.

Module-level (the runtime is passed in), so each route module uses the same path:
``app.py`` (System One) and ``routes_decisions.py`` (OpenAI Decisions, JSON-Schema
decisions).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from onepass.contract import ContractError, SystemOneRequestModel
from onepass.prompt import LabelError
from onepass.server.context import log_fields
from onepass.server.errors import ApiError, from_contract

# --------------------------------------------------------------------------- OpenAPI parts


class ErrorBody(BaseModel):
    message: str
    type: str
    field: str | None = None
    request_id: str | None = None


class ErrorResponse(BaseModel):
    """Every error: ``error.message`` names the field and what was expected."""

    error: ErrorBody
    detail: list[dict[str, Any]] | None = None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request (a contract rule, bad JSON, "
          "duplicate key, corrupt compressed body, box question, image assets)"},
    401: {"model": ErrorResponse, "description": "Wrong API key (only with --api-key)"},
    403: {"model": ErrorResponse, "description": "Missing API key (only with --api-key)"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
    413: {"model": ErrorResponse, "description": "Body, decoded body, prompt tokens or question "
          "count over the limit"},
    415: {"model": ErrorResponse, "description": "Unsupported Content-Encoding"},
    422: {"model": ErrorResponse, "description": "Body does not match the schema (with a "
          "FastAPI-style detail list)"},
    429: {"model": ErrorResponse, "description": "Saturated: retry after retry-after-ms / "
          "retry-after", "headers": {
              "retry-after-ms": {"schema": {"type": "integer"}},
              "retry-after": {"schema": {"type": "integer"}}}},
    503: {"model": ErrorResponse, "description": "Model loading or server shutting down"},
}



def body_spec(schema_name: str) -> dict[str, Any]:
    """The requestBody and Content-Encoding parameter as the server really reads them."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
            "description": "JSON; may be sent with Content-Encoding zstd, gzip or deflate. "
            "Duplicate keys, NaN/Infinity tokens and multipart bodies are refused.",
        },
        "parameters": [{
            "name": "content-encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["zstd", "gzip", "deflate", "identity"]},
            "description": "Compression of the request body (the official client sends zstd "
            "for bodies of 1 KiB or more)",
        }],
    }


# --------------------------------------------------------------------------- the path


def contract_check(check: Callable[[Any], Any], schema: type[BaseModel] = SystemOneRequestModel
                   ) -> Callable[[Any], tuple[Any, Any]]:
    """``check`` of a parsed body as ``read_json`` runs it (off the event loop): the body and
    its result, a contract fault mapped to its status there too (a 422 validates the whole
    body against ``schema``: CPU that grows with the body)."""
    def run(raw: Any) -> tuple[Any, Any]:
        try:
            return raw, check(raw)
        except ContractError as exc:
            raise from_contract(exc, raw, schema) from None

    return run


async def answer(request: Request, rt: Any, work: Callable[[], Any], raw: Any,
                 schema: type[BaseModel] = SystemOneRequestModel, engine: Any = None,
                 map_error: Callable[[ContractError], ApiError] | None = None
                 ) -> dict[str, Any]:
    """Run ``work`` (an engine call returning a System One shaped dict) in ``engine``'s
    bounded queue; record its usage in the access log and metrics. A contract fault raised by
    the work maps through ``map_error`` (else :func:`from_contract` against ``schema``)."""
    fields = log_fields(request)
    try:
        result = await rt.run(request, work, engine)
    except ContractError as exc:  # mapping it may validate the whole body: off the loop
        if map_error is not None:
            raise map_error(exc) from None
        raise await asyncio.to_thread(from_contract, exc, raw, schema) from None
    except LabelError as exc:
        raise ApiError(422, f"questions: {exc}", "unprocessable_request",
                       field="questions") from None
    usage = result.get("usage") or {}
    fields["model"] = result.get("model")
    fields["input_tokens"] = usage.get("input_tokens")
    fields["cached_tokens"] = usage.get("cached_tokens")
    check_finite(result)
    rt.metrics.observe_answer(result, fields.get("queue_ms", 0) / 1000,
                              fields.get("compute_ms", 0) / 1000)
    return result


def check_finite(value: Any) -> None:
    """A NaN/Infinity in a response is a server bug: fail loudly (500, logged)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the engine produced a non-finite number")
    if isinstance(value, dict):
        for v in value.values():
            check_finite(v)
    elif isinstance(value, list):
        for v in value:
            check_finite(v)
