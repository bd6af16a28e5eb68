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

Modules: ``body`` (bytes → JSON), ``encoding`` (Content-Encoding with caps), ``errors``
(envelope and status table), ``context`` (request id, access log, 500s), ``runtime`` (engine
loading, queue, drain), ``admission`` (bounded queue + deadline), ``serving`` (the decision
routes' shared path: checks off the loop, queue, usage in logs and metrics), ``metrics``,
``settings``.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from onepass.contract import (
    DEFAULT_MODEL_ALIAS,
    DecisionRequest,
    SystemOneRequestModel,
    SystemOneResponseModel,
    parse_request,
)
from onepass.limits import too_many
from onepass.schema import DecisionsRequestModel
from onepass.server.body import read_json
from onepass.server.context import (
    RequestContextMiddleware,
    StrictJSONResponse,
    error_response,
    log_fields,
    request_id,
)
from onepass.server.decisions_openai import OpenAIDecisionsRequestModel
from onepass.server.errors import ApiError, retry_headers
from onepass.server.generate_compat import GenerateScoringRequest
from onepass.server.generate_compat import register as register_generate_compat
from onepass.server.openai_schema import REQUEST_MODELS as GENERATION_REQUEST_MODELS
from onepass.server.playground import register as register_playground
from onepass.server.routes_decisions import register as register_decisions
from onepass.server.routes_generation import register as register_generation
from onepass.server.runtime import Runtime
from onepass.server.serving import ERROR_RESPONSES, answer, body_spec, contract_check
from onepass.server.settings import ServerSettings
from onepass.server.skill import register as register_skill


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
        docs_url=None,  # CDN-loaded pages: see the module docstring
        redoc_url=None,
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
        return error_response(exc, request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            message = f"no route {method} {path}; this server answers {served_routes(app)} " \
                      "(GET /.skill says how to call each)"
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
        return error_response(error, request_id(request))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
                   "type": e.get("type", "")} for e in exc.errors()]
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        path = ".".join(str(p) for p in first["loc"] if p != "body")
        error = ApiError(422, f"{path}: {first['msg']}" if path else first["msg"],
                         "invalid_request_error", field=path or None, detail=detail)
        return error_response(error, request_id(request))

    # ------------------------------------------------------------------ API routes

    @app.post(
        "/v1/systemone",
        dependencies=auth,
        response_class=StrictJSONResponse,
        responses={200: {"model": SystemOneResponseModel}, **ERROR_RESPONSES},
        openapi_extra=body_spec("SystemOneRequestModel"),
        summary="Answer typed questions (noul, choice, score) about a state",
        tags=["System One"],
    )
    async def systemone(request: Request) -> Response:
        rt.require_engine()  # ready (or a 503) before the body is read
        fields = log_fields(request)

        def check(raw: Any) -> tuple[DecisionRequest, Any]:
            parsed = parse_request(raw)
            engine = rt.engine_for(parsed.model)  # an unknown model: 404 before any work
            fields["model"] = parsed.model or engine.served_name
            fields["questions"] = len(parsed.questions)
            if len(parsed.questions) > settings.max_questions:
                raise too_many("questions", len(parsed.questions), "questions",
                               settings.max_questions, "max_questions")
            engine.check_model(parsed.model)
            engine.check_request(parsed)  # cache_salt, diagnostics, chat_template_kwargs
            return parsed, engine

        raw, (parsed, engine) = await read_json(request, settings, contract_check(check))
        result = await answer(request, rt, lambda: engine.answer(parsed), raw, engine=engine)
        return StrictJSONResponse(result)

    # POST /v1/decisions (OpenAI Decisions) and /v1/decisions/schema (JSON-Schema decisions)
    register_decisions(app, auth)

    @app.get("/v1/models", dependencies=auth, tags=["System One"],
             response_class=StrictJSONResponse,
             responses={200: {"model": ModelList}, 401: ERROR_RESPONSES[401],
                        403: ERROR_RESPONSES[403], 503: ERROR_RESPONSES[503]},
             summary="The served models and the default model's aliases")
    async def models() -> Response:
        default = rt.require_engine(task=None)  # every model is listed, embedding ones too
        names: list[str] = []
        descriptions: dict[str, str] = {}
        for engine in rt.engines.values():
            names.append(engine.served_name)
            descriptions[engine.served_name] = (
                f"onepass model {engine.served_name!r}: sentence embeddings only "
                "(POST /v1/embeddings)" if getattr(engine, "task", None) == "embedding" else
                f"onepass model {engine.served_name!r}: typed decisions and text generation"
                + (" with a system context" if getattr(engine, "context", None) else ""))
        if DEFAULT_MODEL_ALIAS not in names:
            names.append(DEFAULT_MODEL_ALIAS)
            descriptions[DEFAULT_MODEL_ALIAS] = (
                f"alias of {default.served_name!r} (so are 'typed-lm' and any 'jev-*' name)")
        return StrictJSONResponse({
            "object": "list",
            "data": [{"id": n, "object": "model", "owned_by": "onepass"} for n in names],
            "models": [{"name": n, "description": descriptions[n],
                        "release_date": rt.release_date} for n in names],
        })

    register_generation(app, rt, settings, auth)  # OpenAI chat, completions, responses
    register_generate_compat(app, rt, settings, auth)  # POST /generate: behind sglang-router
    register_playground(app, settings)  # GET /: the playground page (off: --no-playground)
    register_skill(app, settings)  # GET /.skill: how to call every route, for an LLM agent

    # ------------------------------------------------------------------ ops routes

    @app.get("/health", tags=["Operations"], summary="Readiness: 200 once the model is loaded")
    async def health() -> Response:
        if rt.draining:
            return StrictJSONResponse({"status": "draining"}, status_code=503)
        if rt.engine is not None:
            down = await asyncio.to_thread(_unhealthy_engines, rt.engines)  # HTTP: off the loop
            if down:  # a remote engine behind a model is down: not ready for traffic
                return StrictJSONResponse({"status": "engine_unavailable", "engines": down},
                                          status_code=503, headers=retry_headers(2.0))
            return StrictJSONResponse({
                "status": "ok", "startup_seconds": rt.startup_seconds,
                "model": rt.engine.served_name,
                "queue_depth": rt.queue.depth, "in_flight": rt.in_flight,
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
        for model in (SystemOneRequestModel, DecisionsRequestModel, OpenAIDecisionsRequestModel,
                      GenerateScoringRequest, *GENERATION_REQUEST_MODELS.values()):
            schema = model.model_json_schema(
                ref_template="#/components/schemas/{model}", by_alias=True
            )
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

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _unhealthy_engines(engines: dict[str, Any]) -> dict[str, str]:
    """Served name -> why, for each model whose backend reports an unhealthy remote engine."""
    down = {}
    for name, engine in engines.items():
        health = getattr(getattr(engine, "backend", None), "health", None)
        if health is not None:
            ok, detail = health()
            if not ok:
                down[name] = detail
    return down


def _version() -> str:
    try:
        from onepass import __version__

        return __version__
    except ImportError:  # pragma: no cover
        return "0"


__all__ = ["ServerSettings", "create_app"]
