"""Chat Completions on the wire: a ``/v1/chat/completions`` body → :class:`ChatRequest`
(``messages``, ``max_tokens``/``max_completion_tokens``, ``n``, ``logprobs`` + ``top_logprobs``,
``response_format``, ``grammar``, tools, ``reasoning_effort``), and finished or streamed
choices → the completion, its chunks and the usage chunk. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from onepass.contract import ContractError, parse_template_kwargs
from onepass.generate.chat import normalize_messages
from onepass.generate.grammar import GrammarSpec, grammar_request
from onepass.generate.params import MAX_LOGPROBS, SamplingParams
from onepass.generate.reasoning import parse_effort
from onepass.generate.tools import (
    ToolCall,
    ToolSpec,
    check_tool_turns,
    parse_assistant_calls,
)
from onepass.server.openai.common import (
    CHAT_FIELDS,
    MAX_CHOICES,
    Choice,
    Usage,
    _bool,
    _check_fields,
    _int,
    _model,
    _sampling,
    _stream_options,
    _structured,
    _token_bytes,
    _tools,
)


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
