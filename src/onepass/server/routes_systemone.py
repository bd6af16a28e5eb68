"""``POST /v1/systemone`` (the System One contract: what the official ``typesafe-sdk`` sends)
and ``GET /v1/models`` (the served models, in OpenAI's ``data`` and System One's ``models``).

Module-level handlers registered by :func:`register` (see :mod:`.routes_decisions` for why
not an ``APIRouter``); they find the runtime on ``app.state`` and share the decision routes'
path (:mod:`.serving`: checks off the event loop, the bounded queue, metrics, access log).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from onepass.contract import (
    DEFAULT_MODEL_ALIAS,
    DecisionRequest,
    SystemOneResponseModel,
    parse_request,
)
from onepass.limits import too_many
from onepass.server.body import read_json
from onepass.server.context import StrictJSONResponse, log_fields
from onepass.server.serving import ERROR_RESPONSES, answer, body_spec, contract_check


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


async def systemone(request: Request) -> Response:
    rt = request.app.state.runtime
    rt.require_engine()  # ready (or a 503) before the body is read
    fields = log_fields(request)

    def check(raw: Any) -> tuple[DecisionRequest, Any]:
        parsed = parse_request(raw)
        engine = rt.engine_for(parsed.model)  # an unknown model: 404 before any work
        fields["model"] = parsed.model or engine.served_name
        fields["questions"] = len(parsed.questions)
        if len(parsed.questions) > rt.settings.max_questions:
            raise too_many("questions", len(parsed.questions), "questions",
                           rt.settings.max_questions, "max_questions")
        engine.check_model(parsed.model)
        engine.check_request(parsed)  # cache_salt, diagnostics, chat_template_kwargs
        return parsed, engine

    raw, (parsed, engine) = await read_json(request, rt.settings, contract_check(check))
    result = await answer(request, rt, lambda: engine.answer(parsed), raw, engine=engine)
    return StrictJSONResponse(result)


async def models(request: Request) -> Response:
    rt = request.app.state.runtime
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


def register_systemone(app: FastAPI, auth: list[Any]) -> None:
    """``POST /v1/systemone`` behind ``auth``."""
    app.post(
        "/v1/systemone",
        dependencies=auth,
        response_class=StrictJSONResponse,
        responses={200: {"model": SystemOneResponseModel}, **ERROR_RESPONSES},
        openapi_extra=body_spec("SystemOneRequestModel"),
        summary="Answer typed questions (noul, choice, score) about a state",
        tags=["System One"],
    )(systemone)


def register_models(app: FastAPI, auth: list[Any]) -> None:
    """``GET /v1/models`` behind ``auth``."""
    app.get("/v1/models", dependencies=auth, tags=["System One"],
            response_class=StrictJSONResponse,
            responses={200: {"model": ModelList}, 401: ERROR_RESPONSES[401],
                       403: ERROR_RESPONSES[403], 503: ERROR_RESPONSES[503]},
            summary="The served models and the default model's aliases")(models)
