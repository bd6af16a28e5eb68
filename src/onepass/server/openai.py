"""OpenAI wire translation for generation: request bodies → what a route needs, and generated
rows → the objects the official SDK parses. Pure (no web framework, no model).

Three dialects share one sampler (`SamplingParams`, validated under the OpenAI field names):

- Chat Completions: ``messages``, ``max_tokens``/``max_completion_tokens``, ``n``,
  ``logprobs`` (bool) + ``top_logprobs``, ``stream`` + ``stream_options.include_usage``.
- Completions: ``prompt`` (a string or token ids), ``echo``, ``logprobs`` (int), ``max_tokens``
  (0 with ``echo`` scores the prompt only).
- Responses: ``input`` (a string or message items), ``instructions``, ``max_output_tokens``,
  ``store``, ``previous_response_id``.

Structured output: ``response_format`` (chat; ``text``, ``json_object``, ``json_schema``),
``text.format`` (responses) and the ``grammar`` extension (chat, completions: Lark or GBNF)
become one :class:`~onepass.generate.grammar.GrammarSpec` per request, which the route compiles
before the request takes a slot; the grammar then masks every token.

Function tools: ``tools``, ``tool_choice``, ``parallel_tool_calls`` (chat and responses) become
a :class:`~onepass.generate.tools.ToolSpec`; assistant ``tool_calls`` + ``tool`` messages
(chat) and ``function_call`` + ``function_call_output`` items (responses) carry a conversation
on. Rendering, forcing and parsing the calls live in :mod:`onepass.generate.tools`.

Every fault is a `ContractError` naming the user-facing field. A field that would change the
answer but is not implemented (tools, response formats, ...) is refused with a 400 that says so,
never ignored; fields that change nothing here (``user``, ``metadata``, ...) are accepted and
reported (:func:`ignored_fields`: the x-onepass-ignored-fields header and the access log).
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onepass.contract import ContractError, _describe, parse_template_kwargs
from onepass.generate.chat import ROLES, content_text, normalize_messages
from onepass.generate.grammar import GrammarSpec, grammar_from_response_format, grammar_request
from onepass.generate.params import MAX_LOGPROBS, SamplingParams
from onepass.generate.reasoning import parse_effort
from onepass.generate.tools import (
    ToolCall,
    ToolSpec,
    call_record,
    check_tool_turns,
    parse_assistant_calls,
    parse_tool_request,
)

MAX_CHOICES = 8
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions
MAX_METADATA_PAIRS = 16
INPUT_ITEMS_DEFAULT_LIMIT = 20
INPUT_ITEMS_MAX_LIMIT = 100

# The accepted top-level fields of each route (openai_schema.py documents exactly these).
# sampling fields every dialect takes under its OpenAI (or vLLM extension) name
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "seed", "stop", "ignore_eos",
)
# fields that change nothing in a local server (identity, bookkeeping, routing hints)
HARMLESS_FIELDS = ("user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key",
                   "prompt_cache_retention")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")
CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "n", "stream",
    "stream_options", "logprobs", "top_logprobs", "response_format", "grammar",
    "chat_template_kwargs", "reasoning_effort", *TOOL_FIELDS, *SAMPLING_FIELDS, *HARMLESS_FIELDS,
})
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "n", "stream", "stream_options", "logprobs", "echo",
    "grammar", *SAMPLING_FIELDS, *HARMLESS_FIELDS,
})
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "stream", "stream_options", "store",
    "previous_response_id", "text", "reasoning", "grammar", *TOOL_FIELDS, *SAMPLING_FIELDS,
    *HARMLESS_FIELDS,
})
EMBEDDING_FIELDS = frozenset({"model", "input", "dimensions", "encoding_format", "user",
                              "model_token_ids"})
MAX_EMBEDDING_INPUTS = 128
ENCODING_FORMATS = ("float", "base64")
# keys of the Responses ``text`` object (verbosity is accepted only at its default)
TEXT_KEYS = ("format", "verbosity")
# stream_options keys (include_obfuscation is accepted and has no effect here)
STREAM_OPTIONS = ("include_usage", "include_obfuscation")
# meaningful OpenAI fields this server does not implement yet: refused, never ignored
_NOT_YET = {
    "functions": "functions (deprecated tools)",
    "function_call": "function_call (deprecated tools)",
    "audio": "audio output",
    "modalities": "output modalities other than text",
    "prediction": "predicted outputs",
    "reasoning": "reasoning options (on /v1/responses; reasoning_effort here)",
    "web_search_options": "web search",
    "verbosity": "verbosity",
    "max_tool_calls": "tool calls",
    "conversation": "conversations (use previous_response_id or resend the history)",
    "prompt": "prompt templates",
    "include": "extra output data (include)",
    "top_logprobs": "log-probabilities on Responses",
    "background": "background responses",
    "truncation": "automatic truncation (input is never truncated)",
    "suffix": "suffix (insertion)",
    "best_of": "best_of",
    "store": "stored chat completions (store works on /v1/responses)",
}


def _not_yet(name: str, field_name: str | None = None) -> ContractError:
    return ContractError(
        field_name or name, f"{_NOT_YET[name]} is not supported yet by this server; "
        "remove the field (or send its default)",
    )


# values of unimplemented fields that ask for nothing (what a client sends by default)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "response_format": ({"type": "text"},),
    "modalities": (["text"],), "include": ([],), "top_logprobs": (0,), "background": (False,),
    "truncation": ("disabled",), "text": ({}, {"format": {"type": "text"}}),
    "reasoning": ({}, {"effort": None}, {"effort": "none"}), "suffix": ("",), "best_of": (1,),
    "store": (False,),
    # what sglang-router (0.3.2) writes into every OpenAI request it forwards, at its defaults
    "no_stop_trim": (False,), "skip_special_tokens": (True,),
    "return_hidden_states": (False,), "continue_final_message": (False,),
    "separate_reasoning": (True,), "stream_reasoning": (True,),
}


# HARMLESS_FIELDS a route returns in its answer (stored responses keep metadata and user)
_ECHOED = {"POST /v1/responses": frozenset({"metadata", "user"})}


def ignored_fields(body: Any, route: str) -> list[str]:
    """The fields of an accepted ``route`` body that had no effect here (HARMLESS_FIELDS not
    echoed, ``stream_options.include_obfuscation``): reported in the x-onepass-ignored-fields
    response header and the access log, so a client can see what onepass did not use."""
    if not isinstance(body, dict):
        return []
    echoed = _ECHOED.get(route, frozenset())
    names = [k for k in HARMLESS_FIELDS if body.get(k) is not None and k not in echoed]
    options = body.get("stream_options")
    if isinstance(options, dict) and "include_obfuscation" in options:
        names.append("stream_options.include_obfuscation")
    return names


def _check_fields(body: Any, allowed: frozenset[str], route: str) -> dict[str, Any]:
    """The body's fields, nulls and neutral values of unimplemented fields dropped; an
    unknown field, or an unimplemented one that asks for something, is refused."""
    if not isinstance(body, dict):
        raise ContractError("body", f"expected a JSON object, got {_describe(body)}")
    kept = {}
    for key, value in body.items():
        if value is None or (key in _NEUTRAL and value in _NEUTRAL[key]):
            continue
        kept[key] = value
        if key in allowed:
            continue
        if key in _NOT_YET:
            raise _not_yet(key)
        raise ContractError(key, f"unknown field for {route}; see GET /openapi.json for the "
                            "accepted fields")
    return kept


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not model.strip():
        raise ContractError("model", f"expected a non-empty string, got {_describe(model)}")
    return model


def _bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ContractError(name, f"expected true or false, got {_describe(value)}")
    return value


def _int(body: Mapping[str, Any], name: str, low: int, high: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    want = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        got = repr(value) if isinstance(value, float) else _describe(value)
        raise ContractError(name, f"expected {want}, got {got}")
    if value < low or (high is not None and value > high):
        raise ContractError(name, f"expected {want}, got {value}")
    return value


def _sampling(body: Mapping[str, Any], logprobs: int | None,
              max_tokens: int | None) -> SamplingParams:
    fields = {k: body[k] for k in SAMPLING_FIELDS if k in body}
    return SamplingParams.from_request({**fields, "logprobs": logprobs, "max_tokens": max_tokens})


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage`` (only with ``stream: true``, as OpenAI requires)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ContractError("stream_options", "only allowed with stream: true")
    if not isinstance(options, dict):
        raise ContractError("stream_options", f"expected an object, got {_describe(options)}")
    for key in options:
        if key not in STREAM_OPTIONS:
            raise ContractError(f"stream_options.{key}", "unknown option; expected "
                                "include_usage (or include_obfuscation, which has no effect)")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise ContractError("stream_options.include_usage",
                            f"expected true or false, got {_describe(include)}")
    return include


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    meta = body.get("metadata", {})
    if not isinstance(meta, dict) or len(meta) > MAX_METADATA_PAIRS or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
        for k, v in meta.items()
    ):
        raise ContractError("metadata", f"expected an object of at most {MAX_METADATA_PAIRS} "
                            "string keys (<= 64 characters) and string values (<= 512)")
    return dict(meta)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ChatRequest:
    """A validated /v1/chat/completions body (messages are checked by the model's template)."""

    model: str | None
    messages: list[Any]
    params: SamplingParams
    max_tokens: int | None
    max_tokens_field: str
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    grammar: GrammarSpec | None = None
    tools: ToolSpec | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # chat_template_kwargs (thinking may be on)
    reasoning_effort: str | None = None


def chat_messages(raw: Any, field_name: str = "messages") -> list[dict[str, Any]]:
    """Chat messages normalised (role, content, name, tool_call_id) with each assistant
    message's ``tool_calls`` kept as ``[{id, name, arguments}]``; tool results must answer
    the calls before them."""
    if not isinstance(raw, list) or not raw:
        raise ContractError(field_name, "expected a non-empty array of messages")
    out = normalize_messages(raw, field_name)
    for i, message in enumerate(raw):
        calls = message.get("tool_calls")
        if calls is not None:
            if message.get("role") != "assistant":
                raise ContractError(f"{field_name}[{i}].tool_calls",
                                    "only assistant messages carry tool_calls")
            out[i]["tool_calls"] = parse_assistant_calls(calls, f"{field_name}[{i}].tool_calls")
    check_tool_turns(out, field_name)
    return out


def _tools(body: Mapping[str, Any], dialect: str, spec: GrammarSpec | None,
           params: SamplingParams) -> ToolSpec | None:
    """The request's tools; with tools in use, a grammar of the request's own (or stop
    strings while a call is forced) is refused: the tools decide the output's shape."""
    tools = parse_tool_request(body.get("tools"), body.get("tool_choice"),
                               body.get("parallel_tool_calls"), dialect=dialect)
    if tools is not None and tools.active:
        if spec is not None:
            raise ContractError(spec.field.split(".")[0], "structured output cannot be "
                                "combined with tools (unless tool_choice is none): send one "
                                "of them")
        if tools.forced and params.stop:
            raise ContractError("stop", "stop strings cannot be combined with a required "
                                "tool call: the call's grammar decides where the output ends")
    return tools


def _structured(spec: GrammarSpec | None, params: SamplingParams) -> GrammarSpec | None:
    """A grammar with stop strings is refused: the grammar decides where the text ends."""
    if spec is not None and params.stop:
        raise ContractError("stop", f"stop strings cannot be combined with {spec.field}: the "
                            "grammar decides where the output ends")
    return spec


def parse_chat(body: Any) -> ChatRequest:
    body = _check_fields(body, CHAT_FIELDS, "POST /v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ContractError("messages", "expected a non-empty array of messages")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise ContractError("max_completion_tokens", "send max_completion_tokens or "
                            "max_tokens (its older name), not both")
    limit_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int(body, limit_field, 1, None)
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise ContractError("top_logprobs", "only allowed with logprobs: true")
    stream = _bool(body, "stream")
    params = _sampling(body, (top or 0) if logprobs else None, max_tokens)
    spec = grammar_request(body.get("response_format"), body.get("grammar"))
    tools = _tools(body, "chat", spec, params)
    return ChatRequest(
        model=_model(body), messages=chat_messages(messages), params=params, tools=tools,
        max_tokens=max_tokens, max_tokens_field=limit_field,
        n=_int(body, "n", 1, MAX_CHOICES) or 1, stream=stream,
        include_usage=_stream_options(body, stream), logprobs=logprobs,
        grammar=_structured(spec, params),
        template_kwargs=parse_template_kwargs(body.get("chat_template_kwargs"),
                                              decision=False),
        reasoning_effort=parse_effort(body.get("reasoning_effort"), "reasoning_effort"),
    )


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions body. ``max_tokens == 0`` (with echo) scores the prompt."""

    model: str | None
    prompt: str | list[int]
    params: SamplingParams
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool
    grammar: GrammarSpec | None = None

    @property
    def scoring(self) -> bool:
        return self.max_tokens == 0


def parse_completion(body: Any) -> CompletionRequest:
    body = _check_fields(body, COMPLETION_FIELDS, "POST /v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt, as the SDK may send it
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ContractError("prompt", "one prompt per request (a string or an array of token "
                            "ids); send several prompts as separate requests")
    if not (isinstance(prompt, str) and prompt) and not (
        isinstance(prompt, list) and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        raise ContractError("prompt", "expected a non-empty string or a non-empty array of "
                            f"token ids, got {_describe(prompt)}")
    max_tokens = _int(body, "max_tokens", 0, None)
    echo = _bool(body, "echo")
    if max_tokens == 0 and not echo:
        raise ContractError("max_tokens", "expected an integer >= 1 (0 is only for scoring "
                            "the prompt, with echo: true)")
    logprobs = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    stream = _bool(body, "stream")
    params = _sampling(body, logprobs, max_tokens)
    spec = grammar_request(None, body.get("grammar"))
    if spec is not None and max_tokens == 0:
        raise ContractError("grammar", "scoring the prompt (max_tokens 0) generates nothing "
                            "to constrain; remove the grammar")
    return CompletionRequest(
        model=_model(body), prompt=prompt, params=params, max_tokens=max_tokens,
        n=_int(body, "n", 1, MAX_CHOICES) or 1, stream=stream,
        include_usage=_stream_options(body, stream), logprobs=logprobs, echo=echo,
        grammar=_structured(spec, params),
    )


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated /v1/responses body. ``input_items`` are normalised message items (ids
    added), ``messages`` the same as chat messages for the template."""

    model: str | None
    input_items: list[dict[str, Any]]
    instructions: str | None
    params: SamplingParams
    max_output_tokens: int | None
    stream: bool
    store: bool
    previous_response_id: str | None
    metadata: dict[str, str]
    user: str | None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    grammar: GrammarSpec | None = None
    tools: ToolSpec | None = None
    reasoning_effort: str | None = None  # reasoning.effort

    @property
    def messages(self) -> list[dict[str, Any]]:
        return items_messages(self.input_items)


def parse_responses(body: Any) -> ResponsesRequest:
    # read before the neutral values are dropped: effort none still turns a switch off
    effort = _reasoning(body.get("reasoning") if isinstance(body, dict) else None)
    body = _check_fields(body, RESPONSES_FIELDS, "POST /v1/responses")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ContractError("instructions",
                            f"expected a string, got {_describe(instructions)}")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise ContractError("previous_response_id",
                            f"expected a response id (resp_...), got {_describe(previous)}")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ContractError("user", f"expected a string, got {_describe(user)}")
    max_output = _int(body, "max_output_tokens", 1, None)
    stream = _bool(body, "stream")
    _stream_options(body, stream)  # validated; include_obfuscation has no effect here
    params = _sampling(body, None, max_output)
    text_format, spec = _text_format(body.get("text"))
    if body.get("grammar") is not None:  # the extension chat and completions take too
        if spec is not None:
            raise ContractError("grammar", "a grammar and a text.format other than text "
                                "cannot be combined: send one of them")
        spec = grammar_request(None, body["grammar"])
    tools = _tools(body, "responses", spec, params)
    return ResponsesRequest(
        model=_model(body), input_items=parse_input(body.get("input")),
        instructions=instructions or None,
        params=params, max_output_tokens=max_output,
        stream=stream, store=_bool(body, "store"),
        previous_response_id=previous, metadata=_metadata(body), user=user,
        text_format=text_format, grammar=_structured(spec, params), tools=tools,
        reasoning_effort=effort,
    )


def _reasoning(value: Any) -> str | None:
    """Responses ``reasoning``: ``{"effort": ...}`` (``summary`` only null: the reasoning
    itself is returned, never a summary of it)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ContractError("reasoning", f"expected an object, got {_describe(value)}")
    for key in value:
        if key not in ("effort", "summary", "generate_summary"):
            raise ContractError(f"reasoning.{key}", "unknown option; expected effort")
        if key != "effort" and value[key] is not None:
            raise ContractError(f"reasoning.{key}", "reasoning summaries are not supported "
                                "yet by this server (the reasoning itself is returned): "
                                "remove the field")
    return parse_effort(value.get("effort"), "reasoning.effort")


def _text_format(text: Any) -> tuple[dict[str, Any], GrammarSpec | None]:
    """Responses ``text``: ``format`` as the response echoes it, and its grammar (None for
    plain text). ``verbosity`` is taken only at its default (medium), which changes nothing."""
    if text is None:
        return {"type": "text"}, None
    if not isinstance(text, dict):
        raise ContractError("text", f"expected an object, got {_describe(text)}")
    for key in text:
        if key not in TEXT_KEYS:
            raise ContractError(f"text.{key}", "unknown key; expected format (or verbosity)")
    if text.get("verbosity") not in (None, "medium"):
        raise ContractError("text.verbosity", "only medium (the default) is supported; other "
                            "verbosities would need a style instruction this server does not add")
    fmt = text.get("format")
    if fmt is None:
        return {"type": "text"}, None
    spec = grammar_from_response_format(fmt, "text.format")
    return dict(fmt), spec


def parse_input(value: Any, field_name: str = "input") -> list[dict[str, Any]]:
    """Responses ``input``: a string (one user message) or items, each returned as a stored
    item: messages (``id``, ``type: message``, ``role``, typed text parts, ``status``),
    ``function_call`` (a call the model made) and ``function_call_output`` (its result)."""
    if isinstance(value, str):
        if not value:
            raise ContractError(field_name, "expected a non-empty string or message items")
        return [_message_item("user", value)]
    if not isinstance(value, list) or not value:
        raise ContractError(field_name, "expected a non-empty string or a non-empty array of "
                            f"message items, got {_describe(value)}")
    items = []
    for i, raw in enumerate(value):
        where = f"{field_name}[{i}]"
        if not isinstance(raw, dict):
            raise ContractError(where, "expected a message item {role, content}")
        kind = raw.get("type", "message")
        if kind in ("function_call", "function_call_output"):
            items.append(_call_item(raw, kind, where))
            continue
        if kind != "message":
            raise ContractError(f"{where}.type", f"{kind!r} items are not supported yet; "
                                "this server takes message, function_call and "
                                "function_call_output items")
        role = raw.get("role")
        if role not in ROLES or role == "tool":
            raise ContractError(f"{where}.role", "expected one of system, developer, user, "
                                f"assistant, got {role!r}")
        items.append(_message_item(role, content_text(raw.get("content"), f"{where}.content")))
    return items


def _call_item(raw: Mapping[str, Any], kind: str, where: str) -> dict[str, Any]:
    """A function_call or function_call_output input item, checked, as it is stored."""
    if kind == "function_call":
        call = call_record(raw.get("call_id"), raw.get("name"), raw.get("arguments"),
                           id_field=f"{where}.call_id", fn_field=where)
        return function_call_item(ToolCall(call["id"], call["name"], call["arguments"]),
                                  item_id=raw.get("id") if isinstance(raw.get("id"), str)
                                  else None)
    call_id, output = raw.get("call_id"), raw.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise ContractError(f"{where}.call_id", "expected the call_id of the call it answers")
    if not isinstance(output, str):
        output = content_text(output, f"{where}.output")
    return {"id": raw.get("id") if isinstance(raw.get("id"), str) else new_id("fco"),
            "type": "function_call_output", "call_id": call_id, "output": output,
            "status": "completed"}


def items_messages(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Stored items as chat messages: consecutive function_call items become one assistant
    message with ``tool_calls``, a function_call_output a tool message."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
            last = out[-1] if out else None
            if last is not None and last.get("_calls"):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call],
                            "_calls": True})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": item["output"],
                        "tool_call_id": item["call_id"]})
        else:
            out.append(item_message(item))
    for message in out:
        message.pop("_calls", None)
    return out


def _message_item(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    content: dict[str, Any] = {"type": part, "text": text}
    if role == "assistant":
        content["annotations"] = []
    return {"id": new_id("msg"), "type": "message", "role": role, "content": [content],
            "status": "completed"}


def item_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message item as a chat message for the template."""
    text = "".join(part.get("text", "") for part in item.get("content", ()))
    return {"role": item["role"], "content": text}


def function_call_item(call: ToolCall, status: str = "completed",
                       item_id: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output (or stored input) item."""
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": status}


def input_items_page(
    items: Sequence[Mapping[str, Any]], query: Mapping[str, str]
) -> dict[str, Any]:
    """GET /v1/responses/{id}/input_items: ``limit`` (1-100, default 20), ``order`` (desc by
    default, as OpenAI), ``after`` / ``before`` (item ids, exclusive)."""
    for key in query:
        if key not in ("limit", "order", "after", "before", "include"):
            raise ContractError(key, "unknown query parameter; expected limit, order, after "
                                "or before")
    raw_limit = query.get("limit", str(INPUT_ITEMS_DEFAULT_LIMIT))
    # ASCII digits only (str.isdigit accepts "²" and "٣"), and few enough for int()
    if not re.fullmatch(r"[0-9]{1,9}", raw_limit) or not (
            1 <= int(raw_limit) <= INPUT_ITEMS_MAX_LIMIT):
        raise ContractError("limit", f"expected an integer from 1 to {INPUT_ITEMS_MAX_LIMIT}, "
                            f"got {raw_limit[:20]!r}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ContractError("order", f"expected 'asc' or 'desc', got {order!r}")
    if query.get("include"):
        raise _not_yet("include")
    ordered = list(items) if order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    for key in ("after", "before"):
        if key in query and query[key] not in ids:
            raise ContractError(key, f"no input item {query[key]!r} in this response")
    start = ids.index(query["after"]) + 1 if "after" in query else 0
    end = ids.index(query["before"]) if "before" in query else len(ids)
    window = ordered[start:end]
    page = window[: int(raw_limit)]
    return {"object": "list", "data": [dict(i) for i in page],
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(window) > len(page)}


# --------------------------------------------------------------------------- responses


def new_id(prefix: str, sep: str = "_") -> str:
    """``resp_…``/``msg_…``; chat and text completions use ``-`` (``chatcmpl-…``), as OpenAI."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


@dataclass
class Choice:
    """One finished (or, while streaming, growing) sequence in wire-neutral terms."""

    text: str = ""
    tokens: list[Any] = field(default_factory=list)  # TokenInfo
    finish_reason: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None  # a reasoning model's think block (None: it had none)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int = 0  # of completion_tokens, those inside a think block

    @classmethod
    def of(cls, finishes: Sequence[Any], reasoning_tokens: int = 0) -> Usage:
        """n sequences of one prompt: the prompt counted once, completions summed."""
        first = finishes[0]
        return cls(first.prompt_tokens, sum(f.completion_tokens for f in finishes),
                   first.cached_tokens, reasoning_tokens)

    def chat(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}

    def responses(self) -> dict[str, Any]:
        # cache_write_tokens counts explicit cache writes (OpenAI's prompt_cache_options);
        # there are none here: the prefix cache is implicit, like OpenAI's default caching
        return {"input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(tokens: Iterable[Any]) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat completion (or chunk) from TokenInfo records."""
    return {"content": [
        {"token": t.text, "logprob": t.logprob, "bytes": _token_bytes(t.text),
         "top_logprobs": [{"token": s, "logprob": lp, "bytes": _token_bytes(s)}
                          for s, lp in t.top]}
        for t in tokens
    ], "refusal": None}


def chat_completion(
    cid: str, created: int, model: str, choices: Sequence[Choice], usage: Usage,
    logprobs: bool,
) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{
            "index": i,
            "message": assistant_message(c),
            "logprobs": chat_logprobs(c.tokens) if logprobs else None,
            "finish_reason": c.finish_reason,
        } for i, c in enumerate(choices)],
        "usage": usage.chat(),
        "system_fingerprint": None,
    }


def assistant_message(choice: Choice) -> dict[str, Any]:
    """``choices[].message``: with tool calls, ``tool_calls`` (and content null when the
    model wrote nothing else)."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
    if choice.reasoning is not None:  # vLLM's and DeepSeek's name for the think block
        message["reasoning_content"] = choice.reasoning
    if choice.tool_calls:
        message["content"] = choice.text or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in choice.tool_calls]
    return message


def tool_call_deltas(calls: Sequence[ToolCall]) -> list[list[dict[str, Any]]]:
    """Streamed ``delta.tool_calls``, two per call as the SDK assembles them: id, type and
    name with empty arguments first, then the arguments."""
    out = []
    for k, c in enumerate(calls):
        out.append([{"index": k, "id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": ""}}])
        out.append([{"index": k, "function": {"arguments": c.arguments}}])
    return out


def chat_chunk(
    cid: str, created: int, model: str, index: int, *, role: bool = False,
    content: str | None = None, tokens: Sequence[Any] | None = None,
    finish_reason: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
    reasoning_content: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``: the first of a choice carries ``delta.role``."""
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if reasoning_content is not None:
        delta["reasoning_content"] = reasoning_content
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta,
                         "logprobs": chat_logprobs(tokens) if tokens is not None else None,
                         "finish_reason": finish_reason}]}


def usage_chunk(cid: str, created: int, model: str, usage: Usage) -> dict[str, Any]:
    """The chunk ``stream_options.include_usage`` adds before ``[DONE]``: no choices."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage.chat()}


@dataclass
class TextLogprobs:
    """Completions' parallel logprob arrays; ``offset`` is where the next token's text starts
    in the choice text."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    offset: int = 0

    def add(self, text: str, logprob: float | None, top: dict[str, float] | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_generated(self, tokens: Iterable[Any]) -> None:
        for t in tokens:
            self.add(t.text, t.logprob, dict(t.top))

    def add_prompt(self, ids: Sequence[int], scored: Sequence[tuple[float, Any]],
                   decode: Callable[[Sequence[int]], str]) -> None:
        """The echoed prompt: the first token has no logprob (nothing precedes it)."""
        for i, token in enumerate(ids):
            if i == 0:
                self.add(decode([token]), None, None)
            else:
                logprob, top = scored[i - 1]
                self.add(decode([token]), logprob, {decode([t]): lp for t, lp in top})

    def wire(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}

    def take(self) -> dict[str, Any]:
        """The entries so far (for one stream chunk), keeping ``offset`` running."""
        out = self.wire()
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out


def text_completion(
    cid: str, created: int, model: str, texts: Sequence[str], finishes: Sequence[str | None],
    logprobs: Sequence[TextLogprobs | None], usage: Usage | None, *, first_index: int = 0,
) -> dict[str, Any]:
    """A ``text_completion`` object (also each streamed chunk: one choice, ``first_index``
    its index)."""
    out: dict[str, Any] = {
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": first_index + i, "text": text,
                     "logprobs": lp.wire() if lp is not None else None,
                     "finish_reason": finish}
                    for i, (text, finish, lp) in enumerate(zip(texts, finishes, logprobs))],
        "system_fingerprint": None,
    }
    if usage is not None:
        out["usage"] = usage.chat()
    return out


def response_object(
    rid: str, created: int, model: str, req: ResponsesRequest, *, status: str,
    limit: int, output: Sequence[dict[str, Any]] = (), usage: Usage | None = None,
    store: bool | None = None,
) -> dict[str, Any]:
    """A ``response`` object; ``status`` in_progress (streaming start), completed or
    incomplete (stopped at ``max_output_tokens``: ``incomplete_details.reason`` says so)."""
    params = req.params
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "model": model, "output": list(output),
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": req.instructions, "max_output_tokens": limit,
        "metadata": req.metadata,
        "parallel_tool_calls": req.tools.parallel if req.tools is not None else True,
        "previous_response_id": req.previous_response_id,
        "temperature": params.temperature, "top_p": params.top_p,
        "tool_choice": req.tools.choice_wire("responses") if req.tools is not None else "auto",
        "tools": [f.responses_tool() for f in req.tools.functions] if req.tools is not None
        else [],
        "store": req.store if store is None else store,
        "text": {"format": req.text_format}, "truncation": "disabled",
        "reasoning": {"effort": req.reasoning_effort, "summary": None}
        if req.reasoning_effort is not None else None,
        "background": False, "user": req.user,
        "usage": usage.responses() if usage is not None else None,
    }


def output_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    """The assistant message item of a response (``status`` in_progress while streaming)."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(text)] if status != "in_progress" else []}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A reasoning output item (OpenAI's Responses shape): the think block's text as
    ``reasoning_text`` content; no summary is written."""
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def output_item_events(item: Mapping[str, Any],
                       index: int) -> list[tuple[str, dict[str, Any]]]:
    """The stream events of one finished output item, in the order OpenAI sends them (used
    when a reply is held back to check its tool calls): added, its content, done."""
    if item["type"] == "function_call":
        place = {"item_id": item["id"], "output_index": index}
        return [
            ("response.output_item.added", {"output_index": index,
                                            "item": {**item, "arguments": "",
                                                     "status": "in_progress"}}),
            ("response.function_call_arguments.delta", {**place, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**place, "name": item["name"],
                                                       "arguments": item["arguments"]}),
            ("response.output_item.done", {"output_index": index, "item": dict(item)}),
        ]
    text = "".join(part["text"] for part in item["content"])
    place = {"item_id": item["id"], "output_index": index, "content_index": 0}
    if item["type"] == "reasoning":
        return [
            ("response.output_item.added", {"output_index": index, "item": {
                **item, "status": "in_progress", "content": []}}),
            ("response.reasoning_text.delta", {**place, "delta": text}),
            ("response.reasoning_text.done", {**place, "text": text}),
            ("response.output_item.done", {"output_index": index, "item": dict(item)}),
        ]
    return [
        ("response.output_item.added", {"output_index": index, "item": {
            **item, "status": "in_progress", "content": []}}),
        ("response.content_part.added", {**place, "part": output_text("")}),
        ("response.output_text.delta", {**place, "delta": text, "logprobs": []}),
        ("response.output_text.done", {**place, "text": text, "logprobs": []}),
        ("response.content_part.done", {**place, "part": output_text(text)}),
        ("response.output_item.done", {"output_index": index, "item": dict(item)}),
    ]


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event (``data: [DONE]`` when ``data`` is a string)."""
    payload = data if isinstance(data, str) else json.dumps(
        data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


DONE = sse("[DONE]")


def error_event(message: str, kind: str, status: int) -> dict[str, Any]:
    """The frame that reports a failure after an event stream has started (its status
    line, 200, is already sent): the SDK raises it as an APIError."""
    return {"error": {"message": message, "type": kind, "code": status}}


# --------------------------------------------------------------------------- embeddings


@dataclass(frozen=True)
class EmbeddingRequest:
    """A validated /v1/embeddings body: texts (or token-id arrays), in order."""

    model: str | None
    inputs: list[str | list[int]]
    dimensions: int | None
    encoding_format: str


# Token ids carry no tokenizer: OpenAI reads them as tiktoken ids, LangChain's OpenAIEmbeddings
# sends tiktoken ids by default, and most of them fall inside this model's vocabulary too, so
# they would be read as other words without any error. They are taken only when the request
# says they are the served model's own (model_token_ids: true).
FOREIGN_TOKEN_IDS = (
    "token-id input is read as the served model's own token ids, which a client cannot be "
    "assumed to send (LangChain's OpenAIEmbeddings sends tiktoken ids by default); send text "
    "(LangChain: check_embedding_ctx_length=False), or add model_token_ids: true when the ids "
    "come from this model's tokenizer")


def parse_embeddings(body: Any) -> EmbeddingRequest:
    body = _check_fields(body, EMBEDDING_FIELDS, "POST /v1/embeddings")
    raw = body.get("input")
    inputs: list[Any] = [raw] if isinstance(raw, str) else raw
    if isinstance(raw, list) and raw and all(
            isinstance(t, int) and not isinstance(t, bool) for t in raw):
        inputs = [raw]  # one input given as token ids
    if not isinstance(inputs, list) or not inputs:
        raise ContractError("input", "expected a non-empty string or an array of strings, got "
                            f"{_describe(raw)}")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise ContractError("input", f"{len(inputs)} inputs is over the limit of "
                            f"{MAX_EMBEDDING_INPUTS}; send several requests")
    own_ids = _bool(body, "model_token_ids")
    for i, item in enumerate(inputs):
        ok = (isinstance(item, str) and item) or (isinstance(item, list) and item and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item))
        if not ok:
            raise ContractError(f"input[{i}]", "expected a non-empty string or token ids, got "
                                f"{_describe(item)}")
        if isinstance(item, list) and not own_ids:
            raise ContractError(f"input[{i}]", FOREIGN_TOKEN_IDS)
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODING_FORMATS:
        raise ContractError("encoding_format", f"expected float or base64, got {_describe(fmt)}")
    return EmbeddingRequest(_model(body), list(inputs), _int(body, "dimensions", 1, None), fmt)


def embedding_vector(vector: Sequence[float], dimensions: int | None, fmt: str) -> Any:
    """Truncated to ``dimensions`` (when given), then L2-normalised; base64 is the raw
    little-endian float32 bytes, as OpenAI sends them."""
    cut = list(vector[:dimensions] if dimensions else vector)
    norm = math.sqrt(sum(x * x for x in cut)) or 1.0
    cut = [x / norm for x in cut]
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(cut)}f", *cut)).decode("ascii")
    return cut


def embeddings_response(model: str, vectors: Sequence[Sequence[float]], req: EmbeddingRequest,
                        prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i,
                      "embedding": embedding_vector(v, req.dimensions, req.encoding_format)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
