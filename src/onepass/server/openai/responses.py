"""The Responses API on the wire: a ``/v1/responses`` body → :class:`ResponsesRequest`
(``input`` as a string or items, ``instructions``, ``max_output_tokens``, ``store``,
``previous_response_id``, ``text.format``, tools), items ↔ chat messages, the stored input's
pages, and a response object with its output items and streamed events. Pure."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onepass.contract import ContractError, _describe
from onepass.generate.chat import ROLES, content_text
from onepass.generate.grammar import GrammarSpec, grammar_from_response_format, grammar_request
from onepass.generate.params import SamplingParams
from onepass.generate.reasoning import parse_effort
from onepass.generate.tools import (
    ToolCall,
    ToolSpec,
    call_record,
)
from onepass.server.openai.common import (
    INPUT_ITEMS_DEFAULT_LIMIT,
    INPUT_ITEMS_MAX_LIMIT,
    RESPONSES_FIELDS,
    TEXT_KEYS,
    Usage,
    _bool,
    _check_fields,
    _int,
    _metadata,
    _model,
    _not_yet,
    _sampling,
    _stream_options,
    _structured,
    _tools,
    new_id,
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
