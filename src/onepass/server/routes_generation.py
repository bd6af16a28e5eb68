"""OpenAI-compatible generation routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``.

A route validates the body (:mod:`onepass.server.openai`), resolves the model before any work,
renders and checks the prompt, then hands sequences to the model's generation scheduler. Streams
are Server-Sent Events; a client that goes away cancels its sequences, which frees their slots
at the next step. A failure after an event stream started is sent as a final error frame (the
200 status line is already gone) instead of ending the stream as if the text were complete.
The path they share is :mod:`.generation_serving`; here are the handlers, one per route, and
their registration.

Size: seven handlers of three dialects, each a straight line from body to answer; what they
share is already apart (:mod:`.generation_serving`, :mod:`.openai`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass import limits
from onepass.contract import ContractError
from onepass.generate import reasoning as R
from onepass.generate import tools as T
from onepass.generate.streams import Delta, Finish
from onepass.server import openai as W
from onepass.server import openai_schema as S
from onepass.server.context import StrictJSONResponse, log_fields
from onepass.server.errors import ApiError
from onepass.server.generation_serving import (
    EventStream,
    GenerationState,
    active_tools,
    collect,
    compile_grammar,
    failure,
    forwarded,
    framed,
    generation_state,
    merge,
    openai_errors,
    read_in_steps,
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
from onepass.server.runtime import is_embedding
from onepass.server.serving import body_spec

log = logging.getLogger("onepass.server")

_TAGS = ["Generation (OpenAI-compatible)"]
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": S.OpenAIErrorResponse, "description": description}
    for status, description in (
        (400, "Invalid or unsupported parameter (error.param names it)"),
        (401, "Wrong API key (only with --api-key)"),
        (403, "Missing API key (only with --api-key)"),
        (404, "Unknown model, or unknown/expired stored response"),
        (413, "Body over max_body_bytes, or prompt over max_input_tokens"),
        (415, "Unsupported Content-Encoding"),
        (429, "Generation waiting line full: retry after retry-after-ms"),
        (503, "Model loading or server shutting down"),
    )
}
_STORED_ERRORS = {k: v for k, v in _ERRORS.items() if k not in (413, 415, 429)}


def _ok(model: type[Any], stream: str | None = None) -> dict[int | str, dict[str, Any]]:
    """The 200 response (its JSON model; with ``stream``, the event stream too) and the
    errors, for the OpenAPI document."""
    ok: dict[str, Any] = {"model": model, "description": "The object (stream: false)"}
    if stream:
        ok["description"] = f"The object (stream: false), or with stream: true {stream}"
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    return {200: ok, **_ERRORS}


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


# ------------------------------------------------------------------ chat


async def chat_completions(request: Request) -> Response:
    req = await read_openai(request, W.parse_chat, "POST /v1/chat/completions")
    if (remote := await forwarded(request, req.model, "/v1/chat/completions")) is not None:
        return remote
    engine, model = resolve(request, req.model)
    tools = active_tools(req.tools)
    grammar = await compile_grammar(engine, tool_grammar(req.grammar, tools))
    gen = engine.generator
    kwargs = template_kwargs(gen, req.template_kwargs, req.reasoning_effort,
                             "reasoning_effort")
    prompt, fmt = await asyncio.to_thread(tool_prompt, gen, req.messages, tools, "messages",
                                          kwargs)
    thinking = await asyncio.to_thread(thinks, gen, prompt, kwargs)
    limit = gen.output_limit(len(prompt), req.max_tokens, field=req.max_tokens_field,
                             prompt_field="messages")
    running = start(request, gen, prompt, req.params, limit, req.n, grammar)
    cid, created = W.new_id("chatcmpl", "-"), int(time.time())
    if not req.stream:
        choices, finishes = await collect(request, running)
        reasoning_tokens = 0
        for choice, finish in zip(choices, finishes):  # CPU work: off the event loop
            reasoning_tokens += await asyncio.to_thread(split_choice, gen, choice, finish,
                                                        thinking)
            await asyncio.to_thread(settle_tools, choice, tools, fmt)
        usage = W.Usage.of(finishes, reasoning_tokens)
        usage_log(request, model, usage)
        return StrictJSONResponse(
            W.chat_completion(cid, created, model, choices, usage, req.logprobs))

    async def events() -> AsyncIterator[bytes | W.Usage]:
        finishes: list[Finish] = []
        held = [W.Choice() for _ in range(req.n)]  # with tools: the whole reply first
        splitters = [R.ReasoningSplitter(thinking) for _ in range(req.n)]
        pending: list[list[Any]] = [[] for _ in range(req.n)]  # logprobs not yet sent
        reasoning_tokens = 0

        def pieces(i: int, parts: list[tuple[str, str]]) -> list[bytes]:
            frames = []
            for kind, text in parts:
                tokens, pending[i] = pending[i], []
                frames.append(W.sse(W.chat_chunk(
                    cid, created, model, i,
                    tokens=tokens if req.logprobs else None,
                    **({"reasoning_content": text} if kind == "reasoning"
                       else {"content": text}))))
            return frames

        for i in range(req.n):
            yield W.sse(W.chat_chunk(cid, created, model, i, role=True, content=""))
        async for i, event in merge(running):
            if isinstance(event, Delta) and tools is not None:
                held[i].text += event.text
                held[i].tokens.extend(event.tokens)
                continue
            if isinstance(event, Delta):
                pending[i].extend(event.tokens)
                for frame in pieces(i, splitters[i].feed(event.text)):
                    yield frame
                continue
            error = failure(event)
            if error is not None:
                raise error
            finishes.append(event)
            reason = event.reason
            if tools is None:
                for frame in pieces(i, splitters[i].flush()):
                    yield frame
                if pending[i] and req.logprobs:  # held-back text's tokens
                    yield W.sse(W.chat_chunk(cid, created, model, i, content="",
                                             tokens=pending[i]))
                if splitters[i].reasoned:
                    reasoning_tokens += await asyncio.to_thread(
                        R.reasoning_token_count, event.token_ids, gen.backend.decode,
                        thinking)
            if tools is not None:
                choice = held[i]
                choice.finish_reason = reason
                reasoning_tokens += await asyncio.to_thread(split_choice, gen, choice,
                                                            event, thinking)
                if choice.reasoning:
                    yield W.sse(W.chat_chunk(cid, created, model, i,
                                             reasoning_content=choice.reasoning))
                await asyncio.to_thread(settle_tools, choice, tools, fmt)
                reason = choice.finish_reason
                if choice.text:
                    yield W.sse(W.chat_chunk(
                        cid, created, model, i, content=choice.text,
                        tokens=choice.tokens if req.logprobs else None))
                for delta in W.tool_call_deltas(choice.tool_calls):
                    yield W.sse(W.chat_chunk(cid, created, model, i, tool_calls=delta))
            yield W.sse(W.chat_chunk(cid, created, model, i, finish_reason=reason))
        yield W.Usage.of(finishes, reasoning_tokens)

    def usage_chunk(usage: W.Usage) -> dict[str, Any]:
        return W.usage_chunk(cid, created, model, usage)

    return EventStream(framed(events(), request, running, model,
                              usage_chunk if req.include_usage else None), running)


# ------------------------------------------------------------------ completions


async def completions(request: Request) -> Response:
    req = await read_openai(request, W.parse_completion, "POST /v1/completions")
    if (remote := await forwarded(request, req.model, "/v1/completions")) is not None:
        return remote
    engine, model = resolve(request, req.model)
    grammar = await compile_grammar(engine, req.grammar)
    gen, backend = engine.generator, engine.backend
    ids = await asyncio.to_thread(gen.text_prompt, req.prompt, "prompt")
    if req.scoring:
        # scoring reads the prompt only: it must fit max_input_tokens and the context
        limits.check_tokens("prompt", len(ids), max_input_tokens=gen.max_input_tokens,
                            context=gen.backend.context_length)
        limit = 0
    else:
        limit = gen.output_limit(len(ids), req.max_tokens, field="max_tokens",
                                 prompt_field="prompt")
    echoed: W.TextLogprobs | None = None
    echo_text = ""
    if req.echo:
        echo_text = req.prompt if isinstance(req.prompt, str) else backend.decode(ids)
        if req.logprobs is not None:
            top = req.logprobs
            scored = await read_in_steps(request, engine, backend.scoring_reader(ids, top))
            echoed = W.TextLogprobs()
            echoed.add_prompt(ids, scored, backend.decode)
            echoed.offset = len(echo_text)
    cid, created = W.new_id("cmpl", "-"), int(time.time())

    def fresh_logprobs() -> W.TextLogprobs | None:
        if req.logprobs is None:
            return None
        lp = W.TextLogprobs()
        if echoed is not None:
            lp.tokens, lp.token_logprobs = list(echoed.tokens), list(echoed.token_logprobs)
            lp.top_logprobs, lp.text_offset = list(echoed.top_logprobs), list(
                echoed.text_offset)
        lp.offset = len(echo_text)
        return lp

    if req.scoring:
        usage = W.Usage(len(ids), 0, 0)
        usage_log(request, model, usage)
        body = W.text_completion(cid, created, model, [echo_text] * req.n,
                                 ["length"] * req.n,
                                 [fresh_logprobs() for _ in range(req.n)], usage)
        if not req.stream:
            return StrictJSONResponse(body)
        return EventStream(_replay_completion(body, req.include_usage), None)

    running = start(request, gen, ids, req.params, limit, req.n, grammar)
    if not req.stream:
        choices, finishes = await collect(request, running)
        usage = W.Usage.of(finishes)
        usage_log(request, model, usage)
        logprobs = []
        for choice in choices:
            lp = fresh_logprobs()
            if lp is not None:
                lp.add_generated(choice.tokens)
            logprobs.append(lp)
        return StrictJSONResponse(W.text_completion(
            cid, created, model, [echo_text + c.text for c in choices],
            [c.finish_reason for c in choices], logprobs, usage))

    async def events() -> AsyncIterator[bytes | W.Usage]:
        finishes: list[Finish] = []
        logprobs = [fresh_logprobs() for _ in range(req.n)]
        if req.echo:
            for i in range(req.n):
                lp = logprobs[i]
                yield W.sse(W.text_completion(
                    cid, created, model, [echo_text], [None],
                    [_take(lp)], None, first_index=i))
        async for i, event in merge(running):
            lp = logprobs[i]
            if isinstance(event, Delta):
                if lp is not None:
                    lp.add_generated(event.tokens)
                yield W.sse(W.text_completion(cid, created, model, [event.text],
                                              [None], [_take(lp)], None,
                                              first_index=i))
                continue
            error = failure(event)
            if error is not None:
                raise error
            finishes.append(event)
            yield W.sse(W.text_completion(cid, created, model, [""], [event.reason],
                                          [None], None, first_index=i))
        yield W.Usage.of(finishes)

    def usage_chunk(usage: W.Usage) -> dict[str, Any]:
        return W.text_completion(cid, created, model, [], [], [], usage)

    return EventStream(framed(events(), request, running, model,
                              usage_chunk if req.include_usage else None), running)


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


# ------------------------------------------------------------------ embeddings


async def embeddings(request: Request) -> Response:
    rt = runtime(request)
    rt.require_engine(task=None)  # ready (or a 503) before the body is read
    req = await read_openai(request, W.parse_embeddings, "POST /v1/embeddings")
    # without a model: the first embedding model, else the default decoder
    engine = rt.engine_for(req.model, task="embedding")
    model, backend = engine.served_name, engine.backend
    encoder = is_embedding(engine)
    if not encoder and not engine.capabilities.embeds:
        raise ContractError("model", f"model {model!r} has no embedding support")
    width = (backend.dimensions if encoder
             else getattr(getattr(backend, "config", None), "hidden_size", None))
    if req.dimensions is not None and width is not None and req.dimensions > width:
        raise ContractError("dimensions", f"expected at most {width} (the model's "
                            f"{'embedding' if encoder else 'hidden'} size), got "
                            f"{req.dimensions}")
    if encoder:
        encoded = []
        for i, item in enumerate(req.inputs):
            if isinstance(item, list):
                limits.check_vocabulary(f"input[{i}]", item, backend.vocab_size)
            encoded.append(backend.wrap(item) if isinstance(item, list)
                           else await asyncio.to_thread(backend.encode, item))
        for i, ids in enumerate(encoded):  # refused, never truncated
            if len(ids) > backend.max_tokens:
                raise limits.too_long(
                    f"input[{i}]", len(ids), backend.max_tokens,
                    limits.ENCODER_LIMIT, what=f"input[{i}]",
                    advice="shorten the input")
        vectors = await rt.run(request, lambda: backend.embed(encoded), engine)
    else:
        total_limit = engine.generator.max_input_tokens
        encoded, total = [], 0
        for i, item in enumerate(req.inputs):
            ids = (engine.generator.text_prompt(item, f"input[{i}]")
                   if isinstance(item, list)
                   else await asyncio.to_thread(backend.encode, item))
            limits.check_tokens(f"input[{i}]", len(ids), max_input_tokens=total_limit,
                                context=engine.generator.context_length,
                                what=f"input[{i}]")
            total += len(ids)
            if total > total_limit:  # one request reads at most one prompt's worth
                raise limits.too_long(
                    "input", total, total_limit, what=f"input[0..{i}]",
                    when=" together", advice="split them over several requests")
            encoded.append(ids)
        vectors = await read_in_steps(request, engine, backend.embedding_reader(encoded))
    tokens = sum(len(ids) for ids in encoded)
    log_fields(request).update(model=model, input_tokens=tokens)
    return StrictJSONResponse(W.embeddings_response(model, vectors, req, tokens))


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


def _take(lp: W.TextLogprobs | None) -> W.TextLogprobs | None:
    """A chunk's share of the running logprobs (None when not asked for)."""
    if lp is None:
        return None
    chunk = W.TextLogprobs()
    part = lp.take()
    chunk.tokens, chunk.token_logprobs = part["tokens"], part["token_logprobs"]
    chunk.top_logprobs, chunk.text_offset = part["top_logprobs"], part["text_offset"]
    return chunk


async def _replay_completion(body: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """A scoring result as a stream: one chunk per choice, then usage and [DONE]."""
    for choice in body["choices"]:
        yield W.sse({**body, "choices": [choice], "usage": None})
    if include_usage:
        yield W.sse({**body, "choices": []})
    yield W.DONE


# --------------------------------------------------------------------------- registration


def register(app: FastAPI, auth: list[Any]) -> None:
    """Serve the generation routes behind ``auth``: module-level handlers (see
    :mod:`onepass.server.routes_decisions` for why not an ``APIRouter``) that find the runtime
    and this app's :class:`GenerationState` on ``app.state``."""
    app.state.generation = GenerationState()
    app.post("/v1/chat/completions", dependencies=auth, tags=_TAGS,
             responses=_ok(S.ChatCompletionResponseModel, "chat.completion.chunk events "
                           "ending with data: [DONE]"),
             openapi_extra=body_spec("ChatCompletionRequestModel"),
             summary="OpenAI Chat Completions (text), streaming with stream: true",
             )(openai_errors(chat_completions))
    app.post("/v1/completions", dependencies=auth, tags=_TAGS,
             responses=_ok(S.CompletionResponseModel, "text_completion chunks ending with "
                           "data: [DONE]"),
             openapi_extra=body_spec("CompletionRequestModel"),
             summary="OpenAI Completions: text or token-id prompt; max_tokens 0 with echo "
             "and logprobs scores the prompt")(openai_errors(completions))
    app.post("/v1/responses", dependencies=auth, tags=_TAGS,
             responses=_ok(S.ResponseObjectModel, "lifecycle events: response.created, "
                           "response.in_progress, response.output_text.delta ..., then "
                           "response.completed or response.incomplete"),
             openapi_extra=body_spec("ResponseRequestModel"),
             summary="OpenAI Responses (text): streaming lifecycle events, store, "
             "previous_response_id")(openai_errors(responses))
    app.post("/v1/embeddings", dependencies=auth, tags=_TAGS,
             responses=_ok(S.EmbeddingResponseModel),
             openapi_extra=body_spec("EmbeddingRequestModel"),
             summary="OpenAI Embeddings: a sentence-embedding model's vectors (task "
             "embedding), or a decoder's mean-pooled final hidden states",
             )(openai_errors(embeddings))
    app.get("/v1/responses/{response_id}", dependencies=auth, tags=_TAGS,
            responses={200: {"model": S.ResponseObjectModel}, **_STORED_ERRORS},
            summary="A stored response")(openai_errors(get_response))
    app.delete("/v1/responses/{response_id}", dependencies=auth, tags=_TAGS,
               responses={200: {"model": S.ResponseDeletedModel}, **_STORED_ERRORS},
               summary="Delete a stored response")(openai_errors(delete_response))
    app.get("/v1/responses/{response_id}/input_items", dependencies=auth, tags=_TAGS,
            responses={200: {"model": S.ResponseInputItemsModel}, **_STORED_ERRORS},
            openapi_extra=_input_items_query(),
            summary="The input items of a stored response (limit, order, after, before)",
            )(openai_errors(input_items))
