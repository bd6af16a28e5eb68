"""OpenAI generation on a model whose backend is a remote engine: the client's request, already
validated by onepass's own parser, is sent on to the engine's route of the same name (vLLM,
SGLang, llama-server and onepass workers all serve them), and the engine's answer comes back
under the served model name, streamed when asked. The engine enforces what it supports
(sampling, ``response_format`` and tools through its own structured outputs); what it refuses
is the client's 400 with the engine's words; an engine that fails or cannot be reached is a
502/503/504, before the stream or as its final error frame."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from onepass.server import openai as W
from onepass.server.context import StrictJSONResponse, log_fields
from onepass.server.errors import ApiError


async def forward(request: Request, engine: Any, path: str, body: dict[str, Any]) -> Response:
    """``body`` (the client's request to ``path``) answered by ``engine``'s remote engine."""
    name = engine.served_name
    fields = log_fields(request)
    fields.update(model=name, forwarded=engine.backend.engine)
    opened = engine.backend.forward_openai(path, body)
    answer = await opened.__aenter__()  # a refusal is raised here: a real status line
    if not body.get("stream"):
        try:
            data = _renamed(json.loads(await answer.aread()), name)
        except ValueError:
            raise ApiError(502, f"the {engine.backend.engine} engine's answer to {path} is "
                           "not JSON", "engine_error") from None
        finally:
            await opened.__aexit__(None, None, None)
        _log_usage(fields, data)
        return StrictJSONResponse(data)

    async def events() -> AsyncIterator[bytes]:
        try:
            async for line in answer.aiter_lines():
                yield (_renamed_line(line, name, fields) + "\n").encode()
        except ApiError as exc:  # the status line is sent: report it in the stream
            fields["stream_error"] = exc.kind
            yield W.sse(W.error_event(exc.message, exc.kind, exc.status))
        finally:
            await opened.__aexit__(None, None, None)  # the engine stops with the connection

    # a client gone before the first byte never starts events(): close the connection anyway
    closing = BackgroundTask(opened.__aexit__, None, None, None)
    return StreamingResponse(events(), media_type="text/event-stream", background=closing)


def _renamed(data: Any, name: str) -> Any:
    """An engine's JSON answer or event under the served model name (Responses events carry
    the response object nested)."""
    if isinstance(data, dict):
        if "model" in data:
            data["model"] = name
        if isinstance(data.get("response"), dict) and "model" in data["response"]:
            data["response"]["model"] = name
    return data


def _renamed_line(line: str, name: str, fields: dict[str, Any]) -> str:
    """One server-sent-events line: a ``data:`` JSON payload renamed (and its usage logged),
    anything else (``event:``, blank lines, ``[DONE]``) as the engine sent it."""
    if not line.startswith("data:"):
        return line
    payload = line[5:].strip()
    try:
        data = json.loads(payload)
    except ValueError:
        return line
    _log_usage(fields, data)
    return "data: " + json.dumps(_renamed(data, name), ensure_ascii=False)


def _log_usage(fields: dict[str, Any], data: Any) -> None:
    usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("response"), dict):
        usage = data["response"].get("usage") or usage
    if isinstance(usage, dict):
        fields["input_tokens"] = usage.get("prompt_tokens", usage.get("input_tokens"))
        fields["output_tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
