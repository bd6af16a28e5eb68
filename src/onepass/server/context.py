"""The request context: an id on every response, one access-log line per request, metrics
by route and status, and a JSON 500 (logged with the id) for real server faults.

Pure ASGI (no BaseHTTPMiddleware) so a route can still watch ``receive`` for the client's
disconnect while its request waits for the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

from onepass.server.errors import ApiError, ClientGone, retry_headers
from onepass.server.metrics import UNMATCHED

if TYPE_CHECKING:
    from onepass.server.runtime import Runtime

log = logging.getLogger("onepass.server")
access_log = logging.getLogger("onepass.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"
# the accepted request fields that had no effect (openai.ignored_fields, set by the route)
IGNORED_HEADER = b"x-onepass-ignored-fields"
_QUIET_ROUTES = ("/health", "/health/live", "/metrics")


class StrictJSONResponse(JSONResponse):
    """Compact UTF-8 JSON; a non-finite number is a server bug, never sent as NaN."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")


def error_response(exc: ApiError, request_id: str | None) -> StrictJSONResponse:
    return StrictJSONResponse(exc.body(request_id), status_code=exc.status, headers=exc.headers)


def request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def log_fields(request: Request) -> dict[str, Any]:
    """The access-log fields of this request; routes add to them as they learn more."""
    fields = getattr(request.state, "log", None)
    if fields is None:
        fields = {}
        request.state.log = fields
    return fields



class RequestContextMiddleware:
    """Request id on every response, metrics, access log, and a JSON 500 for server faults.

    Pure ASGI (no BaseHTTPMiddleware) so the route can still watch ``receive`` for the
    client's disconnect.
    """

    def __init__(self, app: Any, runtime: Runtime):
        self.app = app
        self.rt = runtime

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = "req_" + uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        fields: dict[str, Any] = {}
        state["log"] = fields
        start = time.perf_counter()
        status = 0
        started = False
        header = (REQUEST_ID_HEADER.encode(), rid.encode())

        async def send_with_id(message: dict) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                extra = [header]
                if fields.get("ignored_fields"):  # accepted fields that had no effect
                    extra.append((IGNORED_HEADER, fields["ignored_fields"].encode()))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        path = scope.get("path", "")
        api = path.startswith("/v1/")
        for name, value in scope.get("headers", ()):
            if name == b"x-typesafe-retry-count":  # the official client's retries: amplification
                fields["client_retry"] = value.decode("latin-1")
        if api:
            self.rt.in_flight_ids.add(rid)
            self.rt.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # Only uvicorn's shutdown cancels requests: the drain deadline has passed. Tell the
            # client to retry elsewhere (503 + retry-after, which the official client retries)
            # and end the task, instead of letting uvicorn answer a bare 500.
            fields["abandoned"] = True
            self.rt.abandoned_ids.add(rid)
            if not started:
                error = ApiError.of(
                    "shutting_down",
                    "the server shut down before this request was answered; retry",
                    headers=retry_headers(1.0),
                )
                with contextlib.suppress(Exception):
                    await error_response(error, rid)(scope, receive, send_with_id)
            status = status or 499
        except ClientGone:
            status = status or 499
        except Exception:
            log.error("server fault", exc_info=True,
                      extra={"fields": {"request_id": rid, "path": path}})
            if not started:
                error = ApiError.of(
                    "internal_error",
                    "internal server error; it has been logged with this request id",
                )
                await error_response(error, rid)(scope, receive, send_with_id)
            status = 500
        finally:
            if api:
                self.rt.in_flight_ids.discard(rid)
                self.rt.metrics.in_flight.dec()
            seconds = time.perf_counter() - start
            # the matched route's path template (the router sets it, also for a 405), never
            # the raw path: metric labels stay bounded by the route table
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            self.rt.metrics.observe_http(route, scope.get("method", ""), status, seconds)
            record = {"request_id": rid, "method": scope.get("method"), "path": path,
                      "status": status, "ms": round(seconds * 1000, 1), **fields}
            level = logging.DEBUG if path in _QUIET_ROUTES else logging.INFO
            if status >= 500 and status != 503:
                level = logging.ERROR
            access_log.log(level, "request", extra={"fields": record})
