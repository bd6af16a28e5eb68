"""Decision routes beside System One: ``POST /v1/decisions`` (the OpenAI Decisions API, what
``openai.OpenAI().decisions.create`` sends) and ``POST /v1/decisions/schema`` (ordered
JSON-Schema decisions, :mod:`onepass.schema`).

Module-level handlers, registered by :func:`register` (not an included ``APIRouter``: FastAPI
0.165 keeps one as a single opaque entry of ``app.routes``, which the 404 message, the metrics
and the docs read route by route). They find the runtime on ``app.state`` and share the
server's path (``serving``: checks off the event loop, the bounded queue, metrics, access-log
fields). ``/v1/decisions`` still serves a JSON-Schema body when that is unambiguous (``schema``
and neither ``questions`` nor ``input``), marked deprecated (``Deprecation: true`` and a
``Link`` to its successor, a warning in the log); any other body is an OpenAI Decisions body.
Its faults are 4xx in the server's envelope plus OpenAI's ``param`` and ``code`` (the SDK maps
400/401/404 to ``BadRequestError``/``AuthenticationError``/``NotFoundError``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass.contract import ContractError
from onepass.limits import too_many
from onepass.schema import (
    DecisionsRequestModel,
    DecisionsResponseModel,
    parse_decisions,
    run_plan,
)
from onepass.server import decisions_openai as D
from onepass.server.body import read_json
from onepass.server.context import StrictJSONResponse, log_fields, request_id
from onepass.server.errors import STATUS_BY_KIND, ApiError, from_contract
from onepass.server.serving import ERROR_RESPONSES, answer, body_spec, contract_check

log = logging.getLogger("onepass.server")

SCHEMA_PATH = "/v1/decisions/schema"
DEPRECATED_HEADERS = {"deprecation": "true", "link": f'<{SCHEMA_PATH}>; rel="successor-version"'}


def _openai_error(exc: ContractError) -> ApiError:
    """A contract fault of an OpenAI Decisions body: the kind's status (an unknown model 404,
    too many questions or a prompt too long 413), else 400 (never the System One 422)."""
    field = D.caller_field(exc.field)
    message = f"{field}: {exc.message}" if field else exc.message
    return ApiError(STATUS_BY_KIND.get(exc.kind, 400), message, exc.kind, field=field or None)


def _with_param(exc: ApiError, request: Request) -> Response:
    """The server's envelope plus OpenAI's ``param`` and ``code``."""
    body = exc.body(request_id(request))
    body["error"]["param"] = exc.field
    body["error"]["code"] = exc.kind
    return StrictJSONResponse(body, status_code=exc.status, headers=exc.headers)


def _schema_check(rt: Any, raw: Any) -> tuple[Any, Any]:
    """A JSON-Schema body: its engine and compiled plan (bounded), before any queueing."""
    model = raw.get("model") if isinstance(raw, dict) else None
    engine = rt.engine_for(model if isinstance(model, str) else None)
    return engine, parse_decisions(engine, raw, max_fields=rt.settings.max_questions)


def _openai_check(rt: Any, raw: Any) -> tuple[D.DecisionsCall, Any]:
    """An OpenAI Decisions body: validated, its model resolved (an unknown one 404) and the
    server's limits applied, before any queueing."""
    call = D.parse_body(raw)
    engine = rt.engine_for(call.model)  # an unknown model: 404 before any work
    engine.check_model(call.model)
    limit = rt.settings.max_questions
    if len(call.asked) > limit:
        raise too_many("questions", len(call.asked), "questions", limit, "max_questions")
    if call.cache_key is not None and not engine.capabilities.cache_namespaces:
        raise ContractError("prompt_cache_key", "not supported by this model's backend (its "
                            "prefix cache has no partitions): send the request without it")
    return call, engine


async def _schema_answer(request: Request, raw: Any, engine: Any, plan: Any,
                         headers: dict[str, str] | None = None) -> Response:
    fields = log_fields(request)
    fields["model"] = raw.get("model") or engine.served_name
    fields["questions"] = len(plan.compiled.fields)
    result = await answer(request, request.app.state.runtime,
                          lambda: run_plan(engine, plan).to_dict(), raw,
                          DecisionsRequestModel, engine)
    return StrictJSONResponse(result, headers=headers)


async def decisions_schema(request: Request) -> Response:
    rt = request.app.state.runtime
    rt.require_engine()
    raw, (engine, plan) = await read_json(
        request, rt.settings,
        contract_check(lambda body: _schema_check(rt, body), DecisionsRequestModel))
    return await _schema_answer(request, raw, engine, plan)


async def decisions(request: Request) -> Response:
    rt = request.app.state.runtime

    def check(raw: Any) -> tuple[Any, Any, Any]:
        """(body, the OpenAI call or None, the engine or the legacy (engine, plan))."""
        if D.is_legacy_schema_body(raw):
            try:
                return raw, None, _schema_check(rt, raw)
            except ContractError as exc:
                raise from_contract(exc, raw, DecisionsRequestModel) from None
        try:
            return (raw, *_openai_check(rt, raw))
        except ContractError as exc:
            raise _openai_error(exc) from None

    try:
        rt.require_engine()
        raw, call, found = await read_json(request, rt.settings, check)
        if call is None:
            log.warning("POST /v1/decisions with a JSON-Schema body is deprecated: send it to "
                        "POST %s", SCHEMA_PATH)
            return await _schema_answer(request, raw, *found, headers=DEPRECATED_HEADERS)
        fields = log_fields(request)
        fields["model"] = call.model
        fields["questions"] = len(call.asked)
        result = await answer(request, rt, lambda: found.answer(call.request, cache_writes=True),
                              raw, engine=found, map_error=_openai_error)
        return StrictJSONResponse(D.build_response(call, result))
    except ApiError as exc:
        return _with_param(exc, request)


def register(app: FastAPI, auth: list[Any]) -> None:
    """Serve both routes behind ``auth`` (the handlers read the runtime from ``app.state``)."""
    app.post(
        "/v1/decisions",
        dependencies=auth,
        response_class=StrictJSONResponse,
        responses={200: {"model": D.OpenAIDecisionModel},
                   **{k: v for k, v in ERROR_RESPONSES.items() if k != 422}},
        openapi_extra=body_spec("OpenAIDecisionsRequestModel"),
        summary="Answer predicate, choice and score questions about an input (the OpenAI "
        "Decisions API: client.decisions.create)",
        tags=["Decisions"],
    )(decisions)
    app.post(
        SCHEMA_PATH,
        dependencies=auth,
        response_class=StrictJSONResponse,
        responses={200: {"model": DecisionsResponseModel}, **ERROR_RESPONSES},
        openapi_extra=body_spec("DecisionsRequestModel"),
        summary="Fill an ordered JSON Schema with typed decisions",
        tags=["Decisions"],
    )(decisions_schema)
