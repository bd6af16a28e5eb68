"""The System One HTTP server: ``create_app(engine_or_loader, settings)``.

Routes: ``POST /v1/systemone``, ``POST /v1/decisions`` (the OpenAI Decisions API) and
``POST /v1/decisions/schema`` (JSON-Schema decisions; both in ``routes_decisions``),
``GET /v1/models``, ``GET /health``, ``GET /health/live``, ``GET /metrics``, ``GET /.skill``
(how to call each, for an LLM agent), ``POST /generate`` (token-id scoring in SGLang's shape,
for a worker behind sglang-router: ``generate_compat``), and the OpenAPI document at
``/openapi.json``. There is no ``/docs`` or ``/redoc`` page: FastAPI's load their scripts from
a CDN (a browser on the page runs whatever that host serves), and the one PyPI package that
ships Swagger UI (swagger-ui-bundle 1.1.0, 2023) bundles a 2022 release; any OpenAPI viewer
reads ``/openapi.json``.

The request path: auth → readiness → body (size cap, Content-Encoding decoded with a cap on
the decoded size) → JSON (duplicate keys refused) → contract validation (a decisions schema is
compiled here, under a step budget) → bounded queue → engine on a worker thread → typed JSON
response. Every response, errors included, carries ``x-typesafe-request-id``; every API
request writes one structured access-log line.

``create_app`` only composes; each route family is a module of module-level handlers with a
``register(app, auth)``: ``routes_systemone``, ``routes_decisions``, ``routes_generation``,
``routes_responses``, ``generate_compat``, ``routes_ops``. Handlers find the runtime on
``app.state``.

Modules: ``body`` (bytes → JSON), ``encoding`` (Content-Encoding with caps), ``errors``
(envelope and status table), ``context`` (request id, access log, 500s), ``runtime`` (engine
loading, queue, drain), ``admission`` (bounded queue + deadline), ``serving`` (the decision
routes' shared path: checks off the loop, queue, usage in logs and metrics), ``metrics``,
``settings``.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from onepass.contract import DEFAULT_MODEL_ALIAS, SystemOneRequestModel
from onepass.schema import DecisionsRequestModel
from onepass.server.context import RequestContextMiddleware, error_response, request_id
from onepass.server.decisions_openai import OpenAIDecisionsRequestModel
from onepass.server.errors import ApiError
from onepass.server.generate_compat import GenerateScoringRequest
from onepass.server.generate_compat import register as register_generate_compat
from onepass.server.openai_schema import REQUEST_MODELS as GENERATION_REQUEST_MODELS
from onepass.server.playground import register as register_playground
from onepass.server.routes_decisions import register as register_decisions
from onepass.server.routes_generation import register as register_generation
from onepass.server.routes_ops import register as register_ops
from onepass.server.routes_responses import register as register_responses
from onepass.server.routes_systemone import ModelList, register_models, register_systemone
from onepass.server.runtime import Runtime
from onepass.server.settings import ServerSettings
from onepass.server.skill import register as register_skill

# a working request for each body model without its own example (shown in /openapi.json and
# /.skill; a test sends each one to the server)
_BODY_EXAMPLES: dict[str, dict[str, Any]] = {
    "SystemOneRequestModel": {
        "state": "Hello! How are you today?",
        "questions": {"greeting": {"type": "noul", "instructions": "The text is a greeting."}},
    },
    "OpenAIDecisionsRequestModel": {
        "model": DEFAULT_MODEL_ALIAS,
        "input": "Team lunch with a client: 42 EUR, receipt attached.",
        "questions": [
            {"type": "predicate", "name": "refundable",
             "instructions": "The expense is refundable."},
            {"type": "choice", "name": "category", "instructions": "What kind of expense?",
             "choices": [{"value": "meal"}, {"value": "travel"}, {"value": "equipment"}]},
            {"type": "score", "name": "urgency", "instructions": "How urgent is it?",
             "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]},
        ],
    },
    "DecisionsRequestModel": {
        "context": "Team lunch with a client: 42 EUR, receipt attached.",
        "schema": {"type": "object", "properties": {
            "category": {"enum": ["meal", "travel", "equipment"]},
            "refundable": {"type": "boolean", "description": "Is the expense refundable?"}}},
        "mode": "sequential",
    },
}


def served_routes(app: FastAPI) -> str:
    """``METHOD path`` of every documented route, from the app's own route table (so the 404
    message cannot drift from what is served); methods of one path are joined with ``/``."""
    by_path: dict[str, list[str]] = {}
    for route in app.routes:
        if getattr(route, "include_in_schema", False):
            methods = sorted(m for m in getattr(route, "methods", None) or () if m != "HEAD")
            by_path.setdefault(getattr(route, "path", ""), []).extend(methods)
    return ", ".join(f"{'/'.join(methods)} {path}" for path, methods in by_path.items()
                     if methods)


# --------------------------------------------------------------------------- error handlers


async def on_api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc, request_id(request))


async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        message = f"no route {method} {path}; this server answers " \
                  f"{served_routes(request.app)} (GET /.skill says how to call each)"
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
        error = ApiError(exc.status_code, str(exc.detail), "http_error", headers=exc.headers)
    return error_response(error, request_id(request))


async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
               "type": e.get("type", "")} for e in exc.errors()]
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    path = ".".join(str(p) for p in first["loc"] if p != "body")
    error = ApiError(422, f"{path}: {first['msg']}" if path else first["msg"],
                     "invalid_request_error", field=path or None, detail=detail)
    return error_response(error, request_id(request))


# --------------------------------------------------------------------------- auth and docs


_BEARER = HTTPBearer(auto_error=False, description="Only when the server runs with --api-key")


def api_key_check(api_key: str | None) -> list[Any]:
    """The dependency list every API route takes: none without a key, else a bearer check
    (a missing key 403, a wrong one 401, compared in constant time)."""
    key = api_key.strip().encode() if api_key else b""
    if not key:  # a blank key is no key (ServerSettings refuses one anyway)
        return []

    async def check_key(
        credentials: HTTPAuthorizationCredentials | None = Depends(_BEARER),  # noqa: B008
    ) -> None:
        if credentials is None:
            raise ApiError.of(
                "missing_api_key",
                "Must supply an API key: send the header 'Authorization: Bearer <key>'",
                headers={"www-authenticate": "Bearer"},
            )
        if not hmac.compare_digest(credentials.credentials.strip().encode(), key):
            raise ApiError.of(
                "invalid_api_key", "Cannot authenticate with the server: the API key is wrong",
                headers={"www-authenticate": "Bearer"},
            )

    return [Depends(check_key)]


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus every request body's JSON Schema (the handlers read raw
    bodies, so FastAPI cannot see them) and a working example for each."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, summary=app.summary,
                      routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (SystemOneRequestModel, DecisionsRequestModel, OpenAIDecisionsRequestModel,
                  GenerateScoringRequest, *GENERATION_REQUEST_MODELS.values()):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                         by_alias=True)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for item in doc.get("paths", {}).values():
        for op in item.values():
            media = op.get("requestBody", {}).get("content", {}).get("application/json")
            name = (media or {}).get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
            if name in _BODY_EXAMPLES:
                media["example"] = _BODY_EXAMPLES[name]
    app.openapi_schema = doc
    return doc


# --------------------------------------------------------------------------- the app


def create_app(
    engine_or_loader: Any, settings: ServerSettings | None = None
) -> FastAPI:
    """The ASGI app around a loaded engine, or around a function that loads one (the server
    then listens at once and loads the model in the background; ``/health`` says when)."""
    settings = settings or ServerSettings()
    rt = Runtime(engine_or_loader, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt.start_loading()
        yield
        rt.shutdown()

    app = FastAPI(
        title="onepass",
        version=_version(),
        summary="Typed decisions (noul, choice, score) from one forward pass: the System One "
        "API, compatible with the official typesafe-sdk client.",
        lifespan=lifespan,
        docs_url=None,  # CDN-loaded pages: see the module docstring
        redoc_url=None,
    )
    app.state.runtime = rt
    app.add_middleware(RequestContextMiddleware, runtime=rt)
    app.add_exception_handler(ApiError, on_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore
    auth = api_key_check(settings.api_key)

    register_systemone(app, auth)  # POST /v1/systemone
    register_decisions(app, auth)  # POST /v1/decisions (OpenAI) and /v1/decisions/schema
    register_models(app, auth)  # GET /v1/models
    register_generation(app, auth)  # OpenAI chat, completions, embeddings
    register_responses(app, auth)  # OpenAI Responses, stored responses
    register_generate_compat(app, auth)  # POST /generate: behind sglang-router
    register_playground(app, settings)  # GET /: the playground page (off: --no-playground)
    register_skill(app, settings)  # GET /.skill: how to call every route, for an LLM agent
    register_ops(app)  # GET /health, /health/live, /metrics
    app.openapi = functools.partial(openapi_document, app)  # type: ignore[method-assign]
    return app


def _version() -> str:
    try:
        from onepass import __version__

        return __version__
    except ImportError:  # pragma: no cover
        return "0"


__all__ = ["ModelList", "ServerSettings", "create_app"]
