"""OpenAI-compatible generation routes: ``POST /v1/chat/completions``, ``POST /v1/completions``
and ``POST /v1/embeddings`` (the Responses API's routes are :mod:`.routes_responses`).

A route validates the body (:mod:`onepass.server.openai`), resolves the model before any work,
renders and checks the prompt, then hands sequences to the model's generation scheduler. Streams
are Server-Sent Events; a client that goes away cancels its sequences, which frees their slots
at the next step. A failure after an event stream started is sent as a final error frame (the
200 status line is already gone) instead of ending the stream as if the text were complete.
The path they share is :mod:`.generation_serving`; here are the handlers, one per route, and
their registration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass import limits
from onepass.contract import ContractError
from onepass.generate import reasoning as R
from onepass.generate.streams import Delta, Finish
from onepass.server import openai as W
from onepass.server import openai_schema as S
from onepass.server.context import StrictJSONResponse, log_fields
from onepass.server.generation_serving import (
    OPENAPI_TAGS,
    EventStream,
    active_tools,
    attach_state,
    backend_kind,
    collect,
    compile_grammar,
    failure,
    forwarded,
    framed,
    merge,
    openai_errors,
    openapi_responses,
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
from onepass.server.runtime import is_embedding
from onepass.server.serving import body_spec

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
            if not engine.capabilities.scores_prompts:
                raise ContractError("echo", f"model {engine.served_name!r} is served by the "
                                    f"{backend_kind(backend)} backend, which does not score "
                                    "prompts: echo with logprobs needs --backend torch")
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
    """Serve chat, completions and embeddings behind ``auth``: module-level handlers (see
    :mod:`onepass.server.routes_decisions` for why not an ``APIRouter``) that find the runtime
    and this app's :class:`GenerationState` on ``app.state``."""
    attach_state(app)
    app.post("/v1/chat/completions", dependencies=auth, tags=OPENAPI_TAGS,
             responses=openapi_responses(S.ChatCompletionResponseModel,
                                         "chat.completion.chunk events ending with data: [DONE]"),
             openapi_extra=body_spec("ChatCompletionRequestModel"),
             summary="OpenAI Chat Completions (text), streaming with stream: true",
             )(openai_errors(chat_completions))
    app.post("/v1/completions", dependencies=auth, tags=OPENAPI_TAGS,
             responses=openapi_responses(S.CompletionResponseModel,
                                         "text_completion chunks ending with data: [DONE]"),
             openapi_extra=body_spec("CompletionRequestModel"),
             summary="OpenAI Completions: text or token-id prompt; max_tokens 0 with echo "
             "and logprobs scores the prompt")(openai_errors(completions))
    app.post("/v1/embeddings", dependencies=auth, tags=OPENAPI_TAGS,
             responses=openapi_responses(S.EmbeddingResponseModel),
             openapi_extra=body_spec("EmbeddingRequestModel"),
             summary="OpenAI Embeddings: a sentence-embedding model's vectors (task "
             "embedding), or a decoder's mean-pooled final hidden states",
             )(openai_errors(embeddings))
