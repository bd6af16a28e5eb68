"""The generation routes' shared path: what ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses`` and ``/v1/embeddings`` (:mod:`.routes_generation`, :mod:`.routes_responses`)
do the same way.

Read the body with the fields that had no effect noted (:func:`read_openai`), forward to a
remote engine that serves the model (:func:`forwarded`), resolve the model before any work
(:func:`resolve`), compile a grammar off the loop, start sequences in the model's step
scheduler with a deadline (:func:`start`: 429 when its line is full) or read a prompt in its
steps (:func:`read_in_steps`), then collect or stream them (:class:`Running`,
:class:`EventStream`, :func:`merge`, :func:`collect`; a failure after the status line is sent
is an error frame, :func:`error_frames`). Errors carry OpenAI's ``param`` and ``code``
(:func:`openai_errors`). The per-app state (the response store, the schedulers hooked to the
metrics) is a :class:`GenerationState` on ``app.state.generation``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from onepass.contract import ContractError
from onepass.generate import reasoning as R
from onepass.generate import tools as T
from onepass.generate.chat import starts_with_bos
from onepass.generate.grammar import GrammarError, GrammarSpec
from onepass.generate.streams import (
    Delta,
    Finish,
    GenerationStream,
    Reader,
    Saturated,
    SchedulerClosed,
)
from onepass.server import openai as W
from onepass.server import openai_schema as S
from onepass.server.body import read_json
from onepass.server.context import StrictJSONResponse, log_fields, request_id
from onepass.server.errors import STATUS_BY_KIND, ApiError, ClientGone, retry_headers
from onepass.server.forwarding import forward
from onepass.server.response_store import ResponseStore
from onepass.server.runtime import Runtime, wait_disconnect

log = logging.getLogger("onepass.server")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def api_error(exc: ContractError) -> ApiError:
    """A contract fault on these routes: the kind's status (model_not_found 404, prompt too
    long 413), else 400; never the System One 422 schema path."""
    return ApiError(STATUS_BY_KIND.get(exc.kind, 400), str(exc), exc.kind, field=exc.field)


def openai_errors(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Any]:
    """Errors in the server's envelope plus OpenAI's ``param`` and ``code``, which OpenAI
    clients read to say which parameter was wrong."""

    @functools.wraps(handler)
    async def wrapped(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            try:
                return await handler(request, *args, **kwargs)
            except ContractError as exc:
                raise api_error(exc) from None
        except ApiError as exc:
            body = exc.body(request_id(request))
            body["error"]["param"] = exc.field
            body["error"]["code"] = exc.kind
            return StrictJSONResponse(body, status_code=exc.status, headers=exc.headers)

    return wrapped


class Running:
    """The sequences of one request: cancelled together, and each finished one measured
    (time to first token, inter-token latency, tokens) once."""

    def __init__(self, streams: Sequence[GenerationStream], metrics: Any):
        self.streams = list(streams)
        self.metrics = metrics
        self.submitted = time.monotonic()
        self._open = set(range(len(self.streams)))

    def finished(self, i: int, finish: Finish) -> None:
        if i not in self._open:
            return
        self._open.discard(i)
        if finish.reason == "deadline" and len(self._open) == len(self.streams) - 1:
            self.metrics.shed.labels("deadline").inc()  # once: the request never started
        first = self.streams[i].first_token_at
        ttft = None if first is None else max(0.0, first - self.submitted)
        itl = None
        if first is not None and finish.completion_tokens > 1:
            itl = (time.monotonic() - first) / (finish.completion_tokens - 1)
        self.metrics.observe_sequence(finish.reason, finish.completion_tokens, ttft, itl)

    def cancel(self) -> None:
        """Stop every unfinished sequence; the scheduler frees its slot at the next step."""
        for i in sorted(self._open):
            self.streams[i].cancel()
            self.metrics.observe_sequence("cancelled", 0, None, None)
        self._open.clear()


class EventStream(StreamingResponse):
    """``text/event-stream`` that cancels its sequences however the response ends (finished,
    client gone, or never started)."""

    def __init__(self, body: AsyncIterator[bytes], running: Running | None):
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._running = running

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._running is not None:
                self._running.cancel()


async def merge(running: Running) -> AsyncIterator[tuple[int, Delta | Finish]]:
    """The events of every sequence as they come, tagged with the sequence's index, until
    all have finished."""
    streams = running.streams
    if len(streams) == 1:
        async for event in streams[0].events():
            if isinstance(event, Finish):
                running.finished(0, event)
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Delta | Finish]] = asyncio.Queue()

    async def pump(i: int, stream: GenerationStream) -> None:
        async for event in stream.events():
            await queue.put((i, event))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, event = await queue.get()
            if isinstance(event, Finish):
                left -= 1
                running.finished(i, event)
            yield i, event
    finally:
        for task in tasks:
            task.cancel()


def failure(finish: Finish) -> ApiError | None:
    """A sequence that did not end normally, as the error to report (None when it did)."""
    if finish.reason == "deadline":  # no slot before the request deadline: shed, come back
        return ApiError.of("overloaded", str(finish.error), headers=retry_headers(1.0))
    if finish.reason == "cancelled":
        return ApiError.of("shutting_down", "the server shut down while generating; retry",
                           headers=retry_headers(1.0))
    if finish.reason == "error" and isinstance(finish.error, GrammarError):
        # the request's own grammar met a parser limit mid-sequence: its fault, a 400
        field = finish.error.field or "response_format"
        return ApiError.of("invalid_request_error", f"{field}: the grammar cannot be followed "
                           f"while generating ({finish.error})", field=field)
    if finish.reason == "error":
        log.error("generation failed", exc_info=finish.error)
        return ApiError.of("internal_error", "generation failed; it has been logged with "
                           "this request id")
    return None


async def collect(
    request: Request, running: Running
) -> tuple[list[W.Choice], list[Finish]]:
    """Every stream to its end (non-streaming responses), cancelling all of them if the
    client disconnects first."""

    async def run() -> tuple[list[W.Choice], list[Finish]]:
        choices = [W.Choice() for _ in running.streams]
        finishes: list[Finish | None] = [None] * len(running.streams)
        async for i, event in merge(running):
            if isinstance(event, Delta):
                choices[i].text += event.text
                choices[i].tokens.extend(event.tokens)
            else:
                error = failure(event)
                if error is not None:
                    raise error
                finishes[i] = event
                choices[i].finish_reason = event.reason
        return choices, [f for f in finishes if f is not None]

    task = asyncio.ensure_future(run())
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            log_fields(request)["disconnected"] = "while_generating"
            raise ClientGone()
        return task.result()
    finally:
        gone.cancel()
        task.cancel()
        running.cancel()


def backend_kind(backend: Any) -> str:
    """The --backend name of a backend object (for messages)."""
    name = type(backend).__name__
    return {"LlamaCppBackend": "llamacpp", "RemoteBackend": "remote"}.get(name, name)


def active_tools(tools: T.ToolSpec | None) -> T.ToolSpec | None:
    return tools if tools is not None and tools.active else None


def tool_grammar(spec: GrammarSpec | None, tools: T.ToolSpec | None) -> GrammarSpec | None:
    """The request's grammar: its own, or (tool_choice required / a named function) the
    grammar of a well-formed call, whose refusals name ``tools``."""
    if tools is not None and tools.forced:
        return GrammarSpec(grammar=T.call_grammar(tools), field="tools")
    return spec


def template_kwargs(gen: Any, kwargs: Sequence[tuple[str, Any]], effort: str | None,
                    effort_field: str) -> dict[str, Any]:
    """A generation request's template variables (its ``chat_template_kwargs`` and reasoning
    effort on the template's thinking switch; see :func:`R.generation_kwargs`)."""
    return R.generation_kwargs(gen.backend.chat_template, kwargs, effort, effort_field,
                               accepts_kwargs=gen.capabilities.template_kwargs)


def thinks(gen: Any, prompt: list[int], kwargs: dict[str, Any]) -> bool:
    """Whether the reply starts inside a think block (:func:`R.thinking_prompt`): the last
    few prompt tokens say whether the template opened one itself."""
    return R.thinking_prompt(kwargs, gen.backend.decode(prompt[-8:]))


def tool_prompt(gen: Any, messages: list[dict[str, Any]], tools: T.ToolSpec | None,
                field: str, kwargs: dict[str, Any] | None = None) -> tuple[list[int], str]:
    """Prompt ids and the call format to parse. A conversation without tools renders as
    before; with tools (or earlier calls), a template that declares tools gets them natively,
    any other the portable instruction (see :mod:`onepass.generate.tools`). ``kwargs``: more
    template variables."""
    backend = gen.backend
    kwargs = kwargs or {}
    uses = tools is not None or any(m.get("tool_calls") or m["role"] == "tool"
                                    for m in messages)
    if not uses:
        return gen.chat_prompt(messages, field, kwargs), "hermes"
    template = getattr(backend, "chat_template", None)
    if T.template_declares_tools(template) and gen.capabilities.tool_templates:
        listed = [f.chat_tool() for f in tools.functions] if tools is not None else None
        try:
            text = backend.render_chat_tools(T.native_messages(messages), listed, **kwargs)
        except Exception as exc:  # the template's own refusal
            raise ContractError(field, f"the model's chat template refused these messages: "
                                f"{exc}") from None
        return gen.encode_prompt(text, field, bos=not starts_with_bos(backend, text)), \
            T.native_format(template)
    return gen.chat_prompt(T.portable_messages(messages, tools), field, kwargs), "hermes"


def split_choice(gen: Any, choice: W.Choice, finish: Finish, thinking: bool) -> int:
    """Move a finished choice's think block into ``choice.reasoning``; its token count."""
    choice.reasoning, choice.text = R.split_reasoning(choice.text, thinking)
    if choice.reasoning is None:
        return 0
    return R.reasoning_token_count(finish.token_ids, gen.backend.decode, thinking)


def settle_tools(choice: W.Choice, tools: T.ToolSpec | None, fmt: str) -> None:
    """Parse a finished choice's calls in place: content and ``tool_calls`` (finish reason
    tool_calls). At the output limit the calls are withheld and the text before them kept;
    a completed malformed (or missing forced) call is a 502, never passed on; a call its
    schema cannot check in bounded time (a backtracking ``pattern``) is the tools' 400."""
    if tools is None:
        return
    if choice.finish_reason == "length":
        choice.text = T.content_before_calls(choice.text)
        return
    try:
        content, calls = T.parse_calls(choice.text, tools, fmt)
        if tools.forced and not calls:
            raise T.MalformedCall("a tool call was required and the model made none")
    except ContractError as exc:  # an ApiError, so a stream reports it as it is too
        raise api_error(exc) from None
    except T.MalformedCall as exc:
        raise ApiError(502, f"the model's tool call is malformed: {exc}; it was not passed on",
                       "invalid_model_output") from None
    if calls:
        choice.text, choice.tool_calls, choice.finish_reason = content, calls, "tool_calls"


def usage_log(request: Request, model: str, usage: W.Usage) -> None:
    """The request's token usage: in its access-log line and the prompt-token counters."""
    request.app.state.runtime.metrics.observe_prompt(usage.prompt_tokens, usage.cached_tokens)
    fields = log_fields(request)
    fields["model"] = model
    fields["input_tokens"] = usage.prompt_tokens
    fields["output_tokens"] = usage.completion_tokens
    fields["cached_tokens"] = usage.cached_tokens


# --------------------------------------------------------------------------- per-app state


@dataclass
class GenerationState:
    """What the generation routes keep per app (on ``app.state.generation``): the stored
    responses, and the schedulers already hooked to the metrics."""

    store: ResponseStore = field(default_factory=ResponseStore)
    schedulers: dict[int, Any] = field(default_factory=dict)  # engine id -> its scheduler


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def generation_state(request: Request) -> GenerationState:
    return request.app.state.generation


async def read_openai(request: Request, parse: Callable[[Any], Any], route: str) -> Any:
    """``read_json`` with ``parse``; the accepted fields that had no effect go into the
    access log and the response's ignored-fields header (the context middleware)."""
    fields = log_fields(request)

    def parse_and_note(body: Any) -> Any:
        req = parse(body)
        request.state.openai_body = body  # as written: a remote engine is sent it
        ignored = W.ignored_fields(body, route)
        if ignored:
            fields["ignored_fields"] = ",".join(ignored)
        return req

    return await read_json(request, runtime(request).settings, parse_and_note)


async def forwarded(request: Request, model: str | None, path: str) -> Response | None:
    """A remote engine's answer when ``model`` is served by one (:mod:`.forwarding`)."""
    engine = runtime(request).require_engine(model)
    if not engine.capabilities.forwards_generation:
        return None
    return await forward(request, engine, path, request.state.openai_body)


def resolve(request: Request, model: str | None) -> tuple[Any, str]:
    """The engine serving ``model`` and its served name: checked before any work."""
    rt = runtime(request)
    engine = rt.require_engine(model)  # each served model by its own name; else 404
    if not engine.capabilities.generation_steps:
        raise ContractError("model", f"model {engine.served_name!r} is served by the "
                            f"{backend_kind(engine.backend)} backend, which does not "
                            "generate through the OpenAI routes (it answers "
                            "/v1/systemone and /v1/decisions); serve it with --backend "
                            "torch or llamacpp, or from an engine with --backend remote, "
                            "to generate")
    hooked = generation_state(request).schedulers
    if id(engine) not in hooked:
        hooked[id(engine)] = engine.generator.scheduler
        hook(rt, engine.generator.scheduler, hooked)
    return engine, engine.served_name


def hook(rt: Runtime, scheduler: Any, hooked: dict[int, Any]) -> None:
    """Metrics read the occupancy of the ``hooked`` schedulers (every served model's, summed)
    and hear about every forward step of ``scheduler``."""
    rt.metrics.bind_generation(active=lambda: sum(s.active for s in hooked.values()),
                               waiting=lambda: sum(s.waiting for s in hooked.values()))
    previous = scheduler.on_step
    if previous is None:
        scheduler.on_step = rt.metrics.observe_step
    else:
        def both(rows: int, tokens: int) -> None:
            previous(rows, tokens)
            rt.metrics.observe_step(rows, tokens)

        scheduler.on_step = both


async def compile_grammar(engine: Any, spec: Any) -> Any:
    """The request's grammar compiled for the model's vocabulary (cached), before the
    request takes a slot: a construct the engine cannot enforce is a 400 naming it."""
    if spec is None:
        return None
    from onepass.generate.grammar import tokenizer_info

    return await asyncio.to_thread(lambda: spec.compile(tokenizer_info(engine.backend)))


def start(request: Request, gen: Any, prompt: list[int], params: Any, limit: int, n: int = 1,
          grammar: Any = None) -> Running:
    """``n`` sequences of ``prompt`` started in the model's scheduler: a 429 when its waiting
    line is full, a 503 when it is shutting down."""
    rt = runtime(request)
    try:
        # a request none of whose sequences got a slot within the deadline is shed (429)
        deadline = time.monotonic() + rt.settings.request_deadline
        return Running(gen.start(prompt, params, limit, n, grammar=grammar,
                                 deadline=deadline), rt.metrics)
    except Saturated as exc:
        rt.metrics.shed.labels("queue_full").inc()
        raise ApiError.of("overloaded", str(exc), headers=retry_headers(1.0)) from None
    except SchedulerClosed:
        rt.metrics.shed.labels("shutting_down").inc()
        raise ApiError.of("shutting_down", "the server is shutting down",
                          headers=retry_headers(1.0)) from None


async def read_in_steps(request: Request, engine: Any, reader: Reader) -> Any:
    """Run ``reader`` (embeddings, prompt scoring) in the model's step scheduler, in prompt
    chunks between everyone else's tokens, through the model's queue; when the client
    goes away its remaining chunks never run."""
    stop = threading.Event()
    scheduler = engine.generator.scheduler
    try:
        return await runtime(request).run(request, lambda: scheduler.read(reader, stop), engine)
    except SchedulerClosed:
        raise ApiError.of("shutting_down", "the server is shutting down",
                          headers=retry_headers(1.0)) from None
    finally:
        stop.set()  # no-op once read; else the scheduler drops it at the next step


async def framed(frames: AsyncIterator[bytes | W.Usage], request: Request, running: Running,
                 model: str, usage_frame: Callable[[W.Usage], dict[str, Any]] | None
                 ) -> AsyncIterator[bytes]:
    """A chat or completions event stream: ``frames``, then ``data: [DONE]``.

    ``frames`` ends with its :class:`~.openai.Usage`: this logs it (:func:`usage_log`) and,
    when the client asked for usage (``usage_frame``), sends it as the last chunk. A failure
    after the status line is sent becomes a final error frame (:func:`error_frames`), and the
    request's sequences are cancelled however the stream ends (a client gone included)."""
    try:
        async for frame in frames:
            if isinstance(frame, W.Usage):
                usage_log(request, model, frame)
                if usage_frame is not None:
                    yield W.sse(usage_frame(frame))
            else:
                yield frame
    except Exception as exc:  # the status line is sent: report it in the stream
        async for error in error_frames(exc, request):
            yield error
    finally:
        running.cancel()
    yield W.DONE


async def error_frames(exc: BaseException, request: Request) -> AsyncIterator[bytes]:
    if isinstance(exc, ApiError):
        error = exc
    else:
        log.error("generation stream failed", exc_info=exc,
                  extra={"fields": {"request_id": request_id(request)}})
        error = ApiError.of("internal_error", "generation failed; it has been logged "
                            "with this request id")
    log_fields(request)["stream_error"] = error.kind
    yield W.sse(W.error_event(error.message, error.kind, error.status))


# --------------------------------------------------------------------------- OpenAPI

# the generation routes' tags and error responses in the OpenAPI document
OPENAPI_TAGS = ["Generation (OpenAI-compatible)"]
OPENAPI_ERRORS: dict[int | str, dict[str, Any]] = {
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
# a stored response is read or deleted: no body, no queue
STORED_OPENAPI_ERRORS = {k: v for k, v in OPENAPI_ERRORS.items() if k not in (413, 415, 429)}


def openapi_responses(model: type[Any], stream: str | None = None
                      ) -> dict[int | str, dict[str, Any]]:
    """The 200 response (its JSON model; with ``stream``, the event stream too) and the
    errors, for the OpenAPI document."""
    ok: dict[str, Any] = {"model": model, "description": "The object (stream: false)"}
    if stream:
        ok["description"] = f"The object (stream: false), or with stream: true {stream}"
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    return {200: ok, **OPENAPI_ERRORS}


def attach_state(app: Any) -> GenerationState:
    """This app's :class:`GenerationState` (``app.state.generation``), made by the first
    generation route module that registers."""
    state = getattr(app.state, "generation", None)
    if state is None:
        state = app.state.generation = GenerationState()
    return state
