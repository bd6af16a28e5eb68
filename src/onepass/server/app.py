"""The System One HTTP server: ``create_app(engine_or_loader, settings)``.

Routes: ``POST /v1/systemone`` (and ``POST /v1/decisions`` when :mod:`onepass.schema` is
present), ``GET /v1/models``, ``GET /health``, ``GET /health/live``, ``GET /metrics``, and the
OpenAPI document at ``/openapi.json`` (``/docs`` renders it).

The request path: auth → readiness → body (size cap, Content-Encoding decoded with a cap on
the decoded size) → JSON (duplicate keys refused) → contract validation → bounded queue →
engine on a worker thread → typed JSON response. Every response, errors included, carries
``x-typesafe-request-id``; every API request writes one structured access-log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from onepass.contract import (
    DEFAULT_MODEL_ALIAS,
    ContractError,
    SystemOneRequestModel,
    SystemOneResponseModel,
    parse_request,
)
from onepass.prompt import LabelError
from onepass.server.encoding import decode_body, parse_content_encoding, read_limited
from onepass.server.errors import ApiError, from_contract, retry_headers
from onepass.server.metrics import Metrics
from onepass.server.scheduler import Cancelled, Closed, Job, Overloaded, Scheduler
from onepass.server.settings import ServerSettings

try:  # POST /v1/decisions: ordered JSON-Schema decisions, when that module is present
    from onepass.schema import DecisionsRequestModel, DecisionsResponseModel, decide_request
except ImportError:  # pragma: no cover - depends on the checkout
    decide_request = None  # type: ignore[assignment]
    DecisionsRequestModel = DecisionsResponseModel = None  # type: ignore[assignment,misc]

log = logging.getLogger("onepass.server")
access_log = logging.getLogger("onepass.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"
MAX_JSON_DEPTH = 100
BODY_READ_TIMEOUT = 30.0  # a client that trickles its body must not hold a connection forever
_THREAD_PARSE_BYTES = 64 * 1024  # bigger bodies are decoded and parsed off the event loop
_QUIET_ROUTES = ("/health", "/health/live", "/metrics")


class ErrorBody(BaseModel):
    message: str
    type: str
    field: str | None = None
    request_id: str | None = None


class ErrorResponse(BaseModel):
    """Every error: ``error.message`` names the field and what was expected."""

    error: ErrorBody
    detail: list[dict[str, Any]] | None = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    owned_by: str


class ModelMetadata(BaseModel):
    name: str
    description: str
    release_date: str = Field(description="YYYY-MM-DD of the checkpoint, or 'unknown'")


class ModelList(BaseModel):
    """OpenAI-style ``data`` and the System One client's ``models``, same names in both."""

    object: str = "list"
    data: list[ModelCard]
    models: list[ModelMetadata]


class ClientGone(Exception):
    """The client disconnected; nothing more is sent."""


# --------------------------------------------------------------------------- runtime state


class Runtime:
    """What the routes share: settings, the engine once loaded, the queue, the metrics."""

    def __init__(self, source: Any, settings: ServerSettings):
        self.settings = settings
        self.metrics = Metrics()
        self.created = time.monotonic()
        self.engine: Any = None
        self.loader: Callable[[], Any] | None = None
        self.load_error: str | None = None
        self.startup_seconds: float | None = None
        self.release_date = "unknown"
        self.draining = False
        self.in_flight_ids: set[str] = set()
        self.abandoned_ids: set[str] = set()
        self.on_load_failure: Callable[[], None] | None = None
        self._load_thread: threading.Thread | None = None
        self.scheduler = Scheduler(
            max_queue=settings.max_queue,
            deadline=settings.request_deadline,
            workers=settings.workers,
            cache_stats=self._cache_stats,
        )
        self.metrics.bind(
            queue_depth=lambda: self.scheduler.depth,
            busy=lambda: self.scheduler.busy,
            ready=lambda: 1.0 if self.ready else 0.0,
            cache_stats=self._cache_stats,
        )
        if hasattr(source, "answer"):
            self._set_engine(source)
        elif callable(source):
            self.loader = source
        else:
            raise TypeError("create_app needs a DecisionEngine or a function that builds one")

    # ------------------------------------------------------------------ model

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.draining

    def _cache_stats(self) -> Any:
        backend = getattr(self.engine, "backend", None)
        stats = getattr(backend, "cache_stats", None)
        return stats() if stats else None

    def _set_engine(self, engine: Any) -> None:
        self.release_date = _release_date(engine)
        self.startup_seconds = round(time.monotonic() - self.created, 3)
        self.engine = engine
        self.metrics.startup.set(self.startup_seconds)
        self.scheduler.start()
        log.info(
            "model ready",
            extra={"fields": {"model": engine.served_name,
                              "startup_seconds": self.startup_seconds}},
        )

    def start_loading(self) -> None:
        """Load the model on a background thread: the server listens (and /health/live
        answers) while it loads."""
        if self.loader is None or self._load_thread is not None:
            return

        def load() -> None:
            try:
                engine = self.loader()
            except BaseException as exc:  # reported on /health and in the log
                self.load_error = f"{exc.__class__.__name__}: {exc}"
                log.error("model failed to load", exc_info=True,
                          extra={"fields": {"error": self.load_error}})
                if self.on_load_failure:
                    self.on_load_failure()
                return
            self._set_engine(engine)

        self._load_thread = threading.Thread(target=load, name="onepass-load", daemon=True)
        self._load_thread.start()

    def require_engine(self) -> Any:
        if self.draining:
            self.metrics.shed.labels("shutting_down").inc()
            raise ApiError.of(
                "shutting_down", "the server is shutting down; retry on another instance",
                headers=retry_headers(1.0),
            )
        if self.engine is None:
            self.metrics.shed.labels("loading").inc()
            if self.load_error:
                raise ApiError.of("model_loading", f"the model failed to load: {self.load_error}")
            raise ApiError.of(
                "model_loading",
                f"the model is still loading ({time.monotonic() - self.created:.0f} s so far); "
                "retry shortly",
                headers=retry_headers(2.0),
            )
        return self.engine

    # ------------------------------------------------------------------ lifecycle

    @property
    def in_flight(self) -> int:
        return len(self.in_flight_ids)

    @property
    def abandoned(self) -> int:
        return len(self.abandoned_ids)

    def begin_drain(self, reason: str = "signal") -> None:
        if not self.draining:
            self.draining = True
            log.info(
                "draining: refusing new requests, letting in-flight ones finish",
                extra={"fields": {"reason": reason, "in_flight": self.in_flight,
                                  "queued": self.scheduler.depth,
                                  "drain_seconds": self.settings.drain_seconds}},
            )

    def shutdown(self) -> None:
        dropped = self.scheduler.close()
        # Requests still in flight now are abandoned too (their cancellation may not have
        # been processed yet); a set, so none is counted twice.
        abandoned = self.abandoned_ids | self.in_flight_ids
        log.info(
            "shutdown complete",
            extra={"fields": {"abandoned": len(abandoned),
                              "dropped_queued": dropped,
                              "answered": self.scheduler.completed}},
        )

    # ------------------------------------------------------------------ running work

    async def run(self, request: Request, work: Callable[[], Any]) -> Any:
        """Queue ``work``, wait for it, and give up (cheaply) if the client disconnects."""
        try:
            job = self.scheduler.submit(work)
        except Overloaded as exc:
            self.metrics.shed.labels(exc.reason).inc()
            raise ApiError.of(
                "overloaded", exc.message, headers=retry_headers(exc.retry_after)
            ) from None
        except Closed:
            self.metrics.shed.labels("shutting_down").inc()
            raise ApiError.of("shutting_down", "the server is shutting down",
                              headers=retry_headers(1.0)) from None
        info = _log_fields(request)
        future = asyncio.wrap_future(job.future)
        future.add_done_callback(_consume)
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            try:
                # Wait until the deadline for the job to start; once it runs, until it ends.
                done, _ = await asyncio.wait(
                    {future, gone}, timeout=max(0.0, job.deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done and self.scheduler.cancel(job):
                    self.metrics.shed.labels("deadline").inc()
                    wait = self.scheduler.expected_wait()
                    raise ApiError.of(
                        "overloaded",
                        f"the request waited {job.queue_seconds:.1f} s without reaching the "
                        f"engine (request deadline {self.settings.request_deadline:g} s); the "
                        "server is saturated, retry later",
                        headers=retry_headers(self.scheduler.retry_after(wait)),
                    )
                if not done:
                    done, _ = await asyncio.wait(
                        {future, gone}, return_when=asyncio.FIRST_COMPLETED
                    )
            except asyncio.CancelledError:  # shutdown past the drain deadline
                self.scheduler.cancel(job)
                raise
            if future not in done:
                dropped = self.scheduler.cancel(job)
                if dropped:
                    self.metrics.shed.labels("disconnected").inc()
                info["disconnected"] = "before_start" if dropped else "while_computing"
                raise ClientGone()
            try:
                result = future.result()
            except Overloaded as exc:
                self.metrics.shed.labels(exc.reason).inc()
                raise ApiError.of(
                    "overloaded", exc.message, headers=retry_headers(exc.retry_after)
                ) from None
            except Cancelled:
                raise ClientGone() from None
            except Closed:
                raise ApiError.of("shutting_down", "the server is shutting down",
                                  headers=retry_headers(1.0)) from None
        finally:
            gone.cancel()
            _timing(info, job)
        return result


def _consume(future: asyncio.Future) -> None:
    """Mark a dropped job's outcome as seen (no "exception was never retrieved" noise)."""
    if not future.cancelled():
        future.exception()


def _timing(info: dict[str, Any], job: Job) -> None:
    info["queue_ms"] = round(job.queue_seconds * 1000, 1)
    info["compute_ms"] = round(job.compute_seconds * 1000, 1)
    if job.cache:
        info["cache"] = job.cache


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _log_fields(request: Request) -> dict[str, Any]:
    fields = getattr(request.state, "log", None)
    if fields is None:
        fields = {}
        request.state.log = fields
    return fields


def _release_date(engine: Any) -> str:
    """The checkpoint's date (YYYY-MM-DD) when it can be found, else "unknown"."""
    model = getattr(getattr(engine, "backend", None), "model", None)
    path = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    try:
        if path and Path(path).exists():
            return date.fromtimestamp(Path(path).stat().st_mtime).isoformat()
    except OSError:
        pass
    return "unknown"


# --------------------------------------------------------------------------- body → JSON


class _DupDict(dict):
    duplicate: str = ""


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
        value = json.loads(data, object_pairs_hook=pairs, parse_constant=_reject_constant)
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


async def read_json(request: Request, settings: ServerSettings) -> Any:
    """The decoded, parsed body of an API request (all client faults are 4xx)."""
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

    fields = _log_fields(request)
    fields["body_bytes"] = len(raw)
    if codings:
        fields["encoding"] = ",".join(codings)

    def decode_and_parse() -> Any:
        data = decode_body(raw, codings, settings.max_body_bytes)
        if codings:
            fields["decoded_bytes"] = len(data)
        return parse_json(data)

    if len(raw) > _THREAD_PARSE_BYTES or codings:
        return await asyncio.to_thread(decode_and_parse)
    return decode_and_parse()


# --------------------------------------------------------------------------- responses


class StrictJSONResponse(JSONResponse):
    """Compact UTF-8 JSON; a non-finite number is a server bug, never sent as NaN."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")


def _error_response(exc: ApiError, request_id: str | None) -> StrictJSONResponse:
    return StrictJSONResponse(exc.body(request_id), status_code=exc.status, headers=exc.headers)


def _request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
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


def _body_spec(schema_name: str) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- ASGI middleware


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
                message = {**message, "headers": [*message.get("headers", []), header]}
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
                    await _error_response(error, rid)(scope, receive, send_with_id)
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
                await _error_response(error, rid)(scope, receive, send_with_id)
            status = 500
        finally:
            if api:
                self.rt.in_flight_ids.discard(rid)
                self.rt.metrics.in_flight.dec()
            seconds = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.rt.metrics.observe_http(route, scope.get("method", ""), status, seconds)
            record = {"request_id": rid, "method": scope.get("method"), "path": path,
                      "status": status, "ms": round(seconds * 1000, 1), **fields}
            level = logging.DEBUG if path in _QUIET_ROUTES else logging.INFO
            if status >= 500 and status != 503:
                level = logging.ERROR
            access_log.log(level, "request", extra={"fields": record})


# --------------------------------------------------------------------------- the app


def create_app(
    engine_or_loader: Any, settings: ServerSettings | None = None
) -> FastAPI:
    """The ASGI app around a loaded engine, or around a function that loads one (the server
    then listens at once and loads the model in the background; ``/health`` says when)."""
    settings = settings or ServerSettings()
    rt = Runtime(engine_or_loader, settings)

    async def lifespan(app: FastAPI):
        rt.start_loading()
        yield
        rt.shutdown()

    app = FastAPI(
        title="onepass",
        version=_version(),
        summary="Typed decisions (noul, choice, score) from one forward pass: the System One "
        "API, compatible with the official typesafe-sdk client.",
        lifespan=lifespan,
    )
    app.state.runtime = rt
    app.add_middleware(RequestContextMiddleware, runtime=rt)

    bearer = HTTPBearer(auto_error=False, description="Only when the server runs with --api-key")
    key = settings.api_key.strip().encode() if settings.api_key else None

    async def check_key(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        if credentials is None:
            raise ApiError.of(
                "missing_api_key",
                "Must supply an API key: send the header 'Authorization: Bearer <key>'",
                headers={"www-authenticate": "Bearer"},
            )
        given = credentials.credentials.strip().encode()
        if not hmac.compare_digest(given, key):
            raise ApiError.of(
                "invalid_api_key", "Cannot authenticate with the server: the API key is wrong",
                headers={"www-authenticate": "Bearer"},
            )

    auth = [Depends(check_key)] if key else []

    # ------------------------------------------------------------------ error handlers

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(exc, _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            message = f"no route {method} {path}; this server answers POST /v1/systemone, " \
                      "GET /v1/models, GET /health, GET /health/live and GET /metrics"
            if path.startswith("/v1/v1/"):
                message += " (the client's base URL must not end in /v1: use http://host:port)"
            error = ApiError.of("not_found", message)
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            error = ApiError.of(
                "method_not_allowed", f"{method} is not allowed on {path}; use {allowed}",
                headers={"allow": allowed} if allowed else None,
            )
        else:
            error = ApiError(exc.status_code, str(exc.detail), "http_error",
                             headers=exc.headers)
        return _error_response(error, _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
                   "type": e.get("type", "")} for e in exc.errors()]
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        path = ".".join(str(p) for p in first["loc"] if p != "body")
        error = ApiError(422, f"{path}: {first['msg']}" if path else first["msg"],
                         "invalid_request_error", field=path or None, detail=detail)
        return _error_response(error, _request_id(request))

    # ------------------------------------------------------------------ API routes

    @app.post(
        "/v1/systemone",
        dependencies=auth,
        response_class=StrictJSONResponse,
        responses={200: {"model": SystemOneResponseModel}, **_ERROR_RESPONSES},
        openapi_extra=_body_spec("SystemOneRequestModel"),
        summary="Answer typed questions (noul, choice, score) about a state",
        tags=["System One"],
    )
    async def systemone(request: Request) -> Response:
        engine = rt.require_engine()
        raw = await read_json(request, settings)
        fields = _log_fields(request)
        try:
            parsed = parse_request(raw)
        except ContractError as exc:
            raise from_contract(exc, raw) from None
        fields["model"] = parsed.model or engine.served_name
        fields["questions"] = len(parsed.questions)
        if len(parsed.questions) > settings.max_questions:
            raise ApiError.of(
                "too_many_questions",
                f"questions: {len(parsed.questions)} questions is over the limit of "
                f"{settings.max_questions} per request (max_questions); split the request",
                field="questions",
            )
        try:
            engine.check_model(parsed.model)
        except ContractError as exc:
            raise from_contract(exc, raw) from None
        result = await _answer(request, lambda: engine.answer(parsed), raw)
        return StrictJSONResponse(result)

    async def _answer(request: Request, work: Callable[[], Any], raw: Any,
                      schema: type[BaseModel] = SystemOneRequestModel) -> dict[str, Any]:
        fields = _log_fields(request)
        try:
            result = await rt.run(request, work)
        except ContractError as exc:
            raise from_contract(exc, raw, schema) from None
        except LabelError as exc:
            raise ApiError(422, f"questions: {exc}", "unprocessable_request",
                           field="questions") from None
        usage = result.get("usage") or {}
        fields["model"] = result.get("model")
        fields["input_tokens"] = usage.get("input_tokens")
        fields["cached_tokens"] = usage.get("cached_tokens")
        _check_finite(result)
        rt.metrics.observe_answer(result, fields.get("queue_ms", 0) / 1000,
                                  fields.get("compute_ms", 0) / 1000)
        return result

    if decide_request is not None:

        @app.post(
            "/v1/decisions",
            dependencies=auth,
            response_class=StrictJSONResponse,
            responses={200: {"model": DecisionsResponseModel}, **_ERROR_RESPONSES},
            openapi_extra=_body_spec("DecisionsRequestModel"),
            summary="Fill an ordered JSON Schema with typed decisions",
            tags=["Decisions"],
        )
        async def decisions(request: Request) -> Response:
            engine = rt.require_engine()
            raw = await read_json(request, settings)
            result = await _answer(
                request, lambda: decide_request(engine, raw), raw, DecisionsRequestModel
            )
            return StrictJSONResponse(result)

    @app.get("/v1/models", dependencies=auth, tags=["System One"],
             response_class=StrictJSONResponse,
             responses={200: {"model": ModelList}, 401: _ERROR_RESPONSES[401],
                        403: _ERROR_RESPONSES[403], 503: _ERROR_RESPONSES[503]},
             summary="The served model and its aliases")
    async def models() -> Response:
        engine = rt.require_engine()
        name = engine.served_name
        names = [name] + [a for a in (DEFAULT_MODEL_ALIAS,) if a != name]
        descriptions = {
            name: f"onepass typed-decision model {name!r}"
            + (" with a system context" if getattr(engine, "context", None) else ""),
            DEFAULT_MODEL_ALIAS: f"alias of {name!r} (so is any 'jev-*' name)",
        }
        return StrictJSONResponse({
            "object": "list",
            "data": [{"id": n, "object": "model", "owned_by": "onepass"} for n in names],
            "models": [{"name": n, "description": descriptions[n],
                        "release_date": rt.release_date} for n in names],
        })

    # ------------------------------------------------------------------ ops routes

    @app.get("/health", tags=["Operations"], summary="Readiness: 200 once the model is loaded")
    async def health() -> Response:
        if rt.draining:
            return StrictJSONResponse({"status": "draining"}, status_code=503)
        if rt.engine is not None:
            return StrictJSONResponse({
                "status": "ok", "startup_seconds": rt.startup_seconds,
                "model": rt.engine.served_name,
                "queue_depth": rt.scheduler.depth, "in_flight": rt.in_flight,
            })
        if rt.load_error:
            return StrictJSONResponse({"status": "failed", "error": rt.load_error},
                                      status_code=503)
        return StrictJSONResponse(
            {"status": "loading", "seconds": round(time.monotonic() - rt.created, 1)},
            status_code=503, headers=retry_headers(2.0),
        )

    @app.get("/health/live", tags=["Operations"], summary="Liveness: independent of the model")
    async def live() -> Response:
        return StrictJSONResponse({"status": "ok"})

    @app.get("/metrics", tags=["Operations"], summary="Prometheus metrics")
    async def metrics() -> Response:
        body, content_type = rt.metrics.render()
        return Response(body, media_type=content_type)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, summary=app.summary,
                          routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        models = [SystemOneRequestModel]
        if DecisionsRequestModel is not None:
            models.append(DecisionsRequestModel)
        for model in models:
            schema = model.model_json_schema(
                ref_template="#/components/schemas/{model}", by_alias=True
            )
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _check_finite(value: Any) -> None:
    """A NaN/Infinity in a response is a server bug: fail loudly (500, logged)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the engine produced a non-finite number")
    if isinstance(value, dict):
        for v in value.values():
            _check_finite(v)
    elif isinstance(value, list):
        for v in value:
            _check_finite(v)


def _version() -> str:
    try:
        from onepass import __version__

        return __version__
    except ImportError:  # pragma: no cover
        return "0"


__all__ = ["ServerSettings", "create_app", "parse_json", "read_json"]
