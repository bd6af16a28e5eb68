"""The OpenAI Responses API's routes: ``POST /v1/responses`` (streaming lifecycle events,
``store``, ``previous_response_id``, tools, reasoning items), ``GET``/``DELETE
/v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.

A response runs like a chat completion (:mod:`.routes_generation`; the shared path is
:mod:`.generation_serving`) over the conversation its input items and the stored responses it
continues make; a stored response keeps its input and output items for the next turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass.generate import reasoning as R
from onepass.generate import tools as T
from onepass.generate.streams import Delta, Finish
from onepass.server import openai as W
from onepass.server import openai_schema as S
from onepass.server.context import StrictJSONResponse, log_fields
from onepass.server.errors import ApiError
from onepass.server.generation_serving import (
    OPENAPI_TAGS,
    STORED_OPENAPI_ERRORS,
    EventStream,
    active_tools,
    attach_state,
    collect,
    compile_grammar,
    failure,
    forwarded,
    generation_state,
    merge,
    openai_errors,
    openapi_responses,
    read_openai,
    resolve,
    runtime,
    settle_tools,
    split_choice,
    start,
    template_kwargs,
    thinks,
    tool_grammar,
    tool_prompt,
    usage_log,
)
from onepass.server.response_store import Stored
from onepass.server.serving import body_spec

log = logging.getLogger("onepass.server")


# ------------------------------------------------------------------ responses


async def responses(request: Request) -> Response:
    req = await read_openai(request, W.parse_responses, "POST /v1/responses")
    if (remote := await forwarded(request, req.model, "/v1/responses")) is not None:
        return remote
    engine, model = resolve(request, req.model)
    store = generation_state(request).store
    tools = active_tools(req.tools)
    grammar = await compile_grammar(engine, tool_grammar(req.grammar, tools))
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None:
            raise ApiError.of(
                "not_found", f"previous_response_id: no stored response "
                f"{req.previous_response_id!r} (unknown, expired after "
                f"{store.max_age:g} s, evicted or deleted; only responses created with "
                "store: true are kept)", field="previous_response_id")
        if previous.model != model:
            raise ApiError(400, f"previous_response_id: {req.previous_response_id!r} "
                           f"was made by model {previous.model!r}, not {model!r}; a "
                           "conversation continues on the same model",
                           "invalid_request_error", field="previous_response_id")
        history = list(previous.history)
    conversation = history + req.messages
    await asyncio.to_thread(T.check_tool_turns, conversation, "input", indexed=False)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions
                else []) + conversation
    gen = engine.generator
    kwargs = template_kwargs(gen, (), req.reasoning_effort, "reasoning.effort")
    prompt, fmt = await asyncio.to_thread(tool_prompt, gen, messages, tools, "input", kwargs)
    thinking = await asyncio.to_thread(thinks, gen, prompt, kwargs)
    limit = gen.output_limit(len(prompt), req.max_output_tokens, field="max_output_tokens",
                             prompt_field="input")
    running = start(request, gen, prompt, req.params, limit, grammar=grammar)
    rid, created, item_id = W.new_id("resp"), int(time.time()), W.new_id("msg")
    reasoning_id = W.new_id("rs")

    async def finished(text: str, finish: Finish) -> dict[str, Any]:
        choice = W.Choice(text=text, finish_reason=finish.reason)
        reasoning_tokens = await asyncio.to_thread(split_choice, gen, choice, finish,
                                                   thinking)
        await asyncio.to_thread(settle_tools, choice, tools, fmt)  # off the event loop
        text = choice.text
        usage = W.Usage.of([finish], reasoning_tokens)
        usage_log(request, model, usage)
        status = W.response_status(finish.reason)
        output = [W.function_call_item(c) for c in choice.tool_calls]
        if text or not output:
            output.insert(0, W.output_message(item_id, text, status))
        if choice.reasoning is not None:
            output.insert(0, W.reasoning_item(reasoning_id, choice.reasoning))
        body = W.response_object(rid, created, model, req, status=status, limit=limit,
                                 output=output, usage=usage)
        if req.store:
            said: dict[str, Any] = {"role": "assistant", "content": text}
            if choice.tool_calls:
                said["tool_calls"] = [{"id": c.id, "name": c.name,
                                       "arguments": c.arguments}
                                      for c in choice.tool_calls]
            entry = Stored(body, model, req.input_items, conversation + [said])
            if not store.put(rid, entry):
                body["store"] = False  # too large to keep: say so, never pretend
        return body

    if not req.stream:
        choices, finishes = await collect(request, running)
        return StrictJSONResponse(await finished(choices[0].text, finishes[0]))

    async def events() -> AsyncIterator[bytes]:
        seq = 0

        def event(kind: str, **data: Any) -> bytes:
            nonlocal seq
            frame = W.sse({"type": kind, "sequence_number": seq, **data}, event=kind)
            seq += 1
            return frame

        start_obj = W.response_object(rid, created, model, req, status="in_progress",
                                      limit=limit)
        text = ""
        try:
            yield event("response.created", response=start_obj)
            yield event("response.in_progress", response=start_obj)
            if tools is not None:  # the whole reply first: its calls are checked
                async for _, ev in merge(running):
                    if isinstance(ev, Delta):
                        text += ev.text
                        continue
                    error = failure(ev)
                    if error is not None:
                        raise error
                    body = await finished(text, ev)
                    for index, item in enumerate(body["output"]):
                        for kind, data in W.output_item_events(item, index):
                            yield event(kind, **data)
                    yield event(f"response.{body['status']}", response=body)
                return
            splitter = R.ReasoningSplitter(thinking)
            content = reasoning = ""
            opened: list[str] = []  # "reasoning", "message": items added, in order
            think = {"item_id": reasoning_id, "output_index": 0, "content_index": 0}

            def close_reasoning() -> list[bytes]:
                item = W.reasoning_item(reasoning_id, reasoning)
                return [event("response.reasoning_text.done", **think, text=reasoning),
                        event("response.output_item.done", output_index=0, item=item)]

            def open_message() -> list[bytes]:
                frames = close_reasoning() if opened == ["reasoning"] else []
                opened.append("message")
                index = opened.index("message")
                return frames + [
                    event("response.output_item.added", output_index=index,
                          item=W.output_message(item_id, "", "in_progress")),
                    event("response.content_part.added", item_id=item_id,
                          output_index=index, content_index=0, part=W.output_text(""))]

            def emit(parts: list[tuple[str, str]]) -> list[bytes]:
                nonlocal content, reasoning
                frames: list[bytes] = []
                for kind, piece in parts:
                    if kind == "reasoning" and "message" not in opened:
                        if not opened:
                            opened.append("reasoning")
                            frames.append(event(
                                "response.output_item.added", output_index=0,
                                item={**W.reasoning_item(reasoning_id, "", "in_progress"),
                                      "content": []}))
                        reasoning += piece
                        frames.append(event("response.reasoning_text.delta", **think,
                                            delta=piece))
                        continue
                    if "message" not in opened:
                        frames += open_message()
                    content += piece
                    frames.append(event("response.output_text.delta", item_id=item_id,
                                        output_index=opened.index("message"),
                                        content_index=0, delta=piece, logprobs=[]))
                return frames

            async for _, ev in merge(running):
                if isinstance(ev, Delta):
                    if ev.text:
                        text += ev.text
                        for frame in emit(splitter.feed(ev.text)):
                            yield frame
                    continue
                error = failure(ev)
                if error is not None:
                    raise error
                for frame in emit(splitter.flush()):
                    yield frame
                if splitter.reasoned and not opened:  # an empty think block
                    opened.append("reasoning")
                    yield event("response.output_item.added", output_index=0,
                                item={**W.reasoning_item(reasoning_id, "", "in_progress"),
                                      "content": []})
                if "message" not in opened:
                    for frame in open_message():
                        yield frame
                body = await finished(text, ev)
                index = opened.index("message")
                place = {"item_id": item_id, "output_index": index}
                yield event("response.output_text.done", **place, content_index=0,
                            text=content, logprobs=[])
                yield event("response.content_part.done", **place, content_index=0,
                            part=W.output_text(content))
                yield event("response.output_item.done", output_index=index,
                            item=body["output"][index])
                yield event(f"response.{body['status']}", response=body)
        except Exception as exc:
            error = exc if isinstance(exc, ApiError) else ApiError.of(
                "internal_error", "generation failed; it has been logged with this "
                "request id")
            if not isinstance(exc, ApiError):
                log.error("responses stream failed", exc_info=exc)
            log_fields(request)["stream_error"] = error.kind
            yield event("error", code=error.kind, message=error.message, param=None)
            failed = {**start_obj, "status": "failed",
                      "error": {"code": "server_error", "message": error.message}}
            yield event("response.failed", response=failed)
        finally:
            running.cancel()

    return EventStream(events(), running)


# ------------------------------------------------------------------ stored responses


def stored(request: Request, rid: str) -> Stored:
    """The stored response ``rid``, or a 404 that says why it may be gone."""
    runtime(request).require_engine()
    store = generation_state(request).store
    entry = store.get(rid)
    if entry is None:
        raise ApiError.of("not_found", f"no stored response {rid!r}: unknown, expired "
                          f"(kept {store.max_age:g} s), evicted or deleted; only "
                          "responses created with store: true are kept", field="response_id")
    return entry


async def get_response(request: Request, response_id: str) -> Response:
    return StrictJSONResponse(stored(request, response_id).response)


async def delete_response(request: Request, response_id: str) -> Response:
    stored(request, response_id)
    generation_state(request).store.delete(response_id)
    return StrictJSONResponse({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request, response_id: str) -> Response:
    entry = stored(request, response_id)
    return StrictJSONResponse(
        W.input_items_page(entry.input_items, dict(request.query_params)))


def _input_items_query() -> dict[str, Any]:
    """The query parameters of GET .../input_items (read by openai.input_items_page)."""
    return {"parameters": [
        {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": W.INPUT_ITEMS_MAX_LIMIT,
                    "default": W.INPUT_ITEMS_DEFAULT_LIMIT},
         "description": "Items per page"},
        {"name": "order", "in": "query", "required": False,
         "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"},
         "description": "desc: newest first, as OpenAI"},
        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "Start after this item id (exclusive)"},
        {"name": "before", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "Stop before this item id (exclusive)"},
    ]}


# --------------------------------------------------------------------------- registration


def register(app: FastAPI, auth: list[Any]) -> None:
    """Serve the Responses API's routes behind ``auth``, module-level handlers like
    :mod:`.routes_generation`'s; the stored responses live in this app's
    :class:`GenerationState`."""
    attach_state(app)
    app.post("/v1/responses", dependencies=auth, tags=OPENAPI_TAGS,
             responses=openapi_responses(
                 S.ResponseObjectModel, "lifecycle events: response.created, "
                 "response.in_progress, response.output_text.delta ..., then "
                 "response.completed or response.incomplete"),
             openapi_extra=body_spec("ResponseRequestModel"),
             summary="OpenAI Responses (text): streaming lifecycle events, store, "
             "previous_response_id")(openai_errors(responses))
    app.get("/v1/responses/{response_id}", dependencies=auth, tags=OPENAPI_TAGS,
            responses={200: {"model": S.ResponseObjectModel}, **STORED_OPENAPI_ERRORS},
            summary="A stored response")(openai_errors(get_response))
    app.delete("/v1/responses/{response_id}", dependencies=auth, tags=OPENAPI_TAGS,
               responses={200: {"model": S.ResponseDeletedModel}, **STORED_OPENAPI_ERRORS},
               summary="Delete a stored response")(openai_errors(delete_response))
    app.get("/v1/responses/{response_id}/input_items", dependencies=auth, tags=OPENAPI_TAGS,
            responses={200: {"model": S.ResponseInputItemsModel}, **STORED_OPENAPI_ERRORS},
            openapi_extra=_input_items_query(),
            summary="The input items of a stored response (limit, order, after, before)",
            )(openai_errors(input_items))
