"""What the OpenAI generation dialects share: the accepted fields of each route (which
:mod:`onepass.server.openai_schema` documents), the refusal of meaningful fields not implemented
yet (never ignored) and the report of harmless ones, field readers that name the field they
fault, sampling, tools and structured output into one request shape, and the pieces every
answer is built from (ids, :class:`Choice`, :class:`Usage`, server-sent events). Pure."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onepass.contract import ContractError, _describe, check_integer
from onepass.generate.grammar import GrammarSpec
from onepass.generate.params import SamplingParams
from onepass.generate.tools import (
    ToolCall,
    ToolSpec,
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
    return None if value is None else check_integer(name, value, low, high)


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
