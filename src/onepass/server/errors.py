"""Every error the server sends, in one envelope the official client can read.

Body: ``{"error": {"message", "type", "field"?, "request_id"}}``, plus a FastAPI-style
``"detail": [{"loc", "msg", "type"}]`` list for schema errors (422). The typesafe-sdk reads
``error.message`` first, so the message always names the field and what was expected.

Client faults are always 4xx: the client retries 408/429/5xx, so a bad request answered with
a 5xx would be sent three times. The status table lives in :data:`STATUS_BY_KIND`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from onepass.contract import ContractError, SystemOneRequestModel

# Status for each error type ("kind"). ContractError kinds come from onepass.contract; the
# others are the server's own.
STATUS_BY_KIND: dict[str, int] = {
    "invalid_json": 400,
    "duplicate_key": 400,
    "invalid_encoding": 400,
    "invalid_request_error": 400,  # a business rule of the contract (422 for schema errors)
    "unsupported_question_type": 400,  # box: needs a vision model
    "unsupported_asset": 400,  # image assets / multipart: need a vision model
    "missing_api_key": 403,
    "invalid_api_key": 401,
    "model_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "request_too_large": 413,
    "max_tokens_exceeded": 413,
    "too_many_questions": 413,
    "unsupported_encoding": 415,
    "unprocessable_request": 422,
    "overloaded": 429,
    "model_loading": 503,
    "shutting_down": 503,
    "internal_error": 500,
    "invalid_model_output": 502,  # a completed tool call that is malformed: never passed on
    "engine_error": 502,  # a remote engine answered with an error or an unreadable body
    "engine_unavailable": 503,  # a remote engine cannot be reached (with retry-after)
    "engine_timeout": 504,  # a remote engine did not answer in time
}


class ApiError(Exception):
    """An HTTP error response: status, a readable message naming the field, and a type."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
        detail: list[dict[str, Any]] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.field = field
        self.headers = dict(headers or {})
        self.detail = detail

    @classmethod
    def of(cls, kind: str, message: str, **kwargs: Any) -> ApiError:
        """An error whose status comes from the table."""
        return cls(STATUS_BY_KIND[kind], message, kind, **kwargs)

    def body(self, request_id: str | None) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.kind}
        if self.field:
            error["field"] = self.field
        if request_id:
            error["request_id"] = request_id
        out: dict[str, Any] = {"error": error}
        if self.detail is not None:
            out["detail"] = self.detail
        return out


class ClientGone(Exception):
    """The client disconnected: nothing more is sent (logged as status 499)."""


def retry_headers(seconds: float) -> dict[str, str]:
    """``retry-after-ms`` (read first by the official client) and ``retry-after`` (seconds)."""
    ms = max(1, round(seconds * 1000))
    return {"retry-after-ms": str(ms), "retry-after": str(max(1, -(-ms // 1000)))}


_INDEX = re.compile(r"\[(\d+)\]")


def field_loc(field: str) -> list[str | int]:
    """``questions.a.criteria[2]`` -> ``["body", "questions", "a", "criteria", 2]``."""
    loc: list[str | int] = ["body"]
    if not field or field == "body":
        return loc
    for part in field.split("."):
        head, *rest = _INDEX.split(part)
        if head:
            loc.append(head)
        loc.extend(int(x) for x in rest if x)
    return loc


def pydantic_detail(exc: ValidationError, limit: int = 20) -> list[dict[str, Any]]:
    """FastAPI's ``detail`` entries without the echoed input (which may be a whole body)."""
    return [
        {"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False)[:limit]
    ]


def schema_errors(
    raw: Any, schema: type[BaseModel] = SystemOneRequestModel
) -> list[dict[str, Any]] | None:
    """Pydantic's view of ``raw`` against the published request schema; None if it fits."""
    if isinstance(raw, dict) and "state" not in raw and "document" in raw:
        raw = {**raw, "state": raw["document"]}
    try:
        schema.model_validate(raw)
    except ValidationError as exc:
        return pydantic_detail(exc)
    return None


def from_contract(
    exc: ContractError, raw: Any = None, schema: type[BaseModel] = SystemOneRequestModel
) -> ApiError:
    """Map a contract violation to a status.

    ``parse_request`` decides what is accepted. Its generic violations are 422 with a
    FastAPI ``detail`` list when the body also fails the published schema (a shape problem:
    wrong type, missing field), and 400 when the shape is right but a rule is broken (a noul
    without instructions or criteria, noul criteria keys, an empty model name, ...).
    """
    kind = exc.kind
    field = exc.field or None
    message = str(exc)
    if kind == "invalid_request_error":
        detail = schema_errors(raw, schema)
        if detail is not None:
            first = {"loc": field_loc(exc.field), "msg": exc.message, "type": "value_error"}
            return ApiError(
                422, message, "invalid_request_error", field=field, detail=[first, *detail]
            )
        return ApiError(400, message, kind, field=field)
    status = STATUS_BY_KIND.get(kind, 400)
    return ApiError(status, message, kind, field=field)
