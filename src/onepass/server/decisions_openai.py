"""The OpenAI Decisions API (``client.decisions.create``) as onepass System One requests.

Pure: no web framework, no torch. :func:`parse_body` turns a decoded ``POST /v1/decisions``
body into a :class:`DecisionsCall` (the System One :class:`~onepass.contract.DecisionRequest`
the engine answers, plus what is needed to answer in OpenAI's shape); :func:`build_response`
turns the engine's System One answer into the ``Decision`` object the official ``openai``
SDK parses. Every fault is a :class:`~onepass.contract.ContractError` naming the field
(``input[3].call_id``, ``questions[2].choices[1].value``).

Input rendering. A string ``input`` is the state as is, so it reads exactly the prompt the
same System One request reads (and so does a lone user message of text). A list of items
renders as a role-labelled transcript, one block per item in order, blocks separated by a
blank line: ``User: …``, ``Assistant: …`` (a refusal part as ``Refusal: …``), ``System: …``,
``Developer: …``, ``Function call <name> (call_id <id>): <arguments>``, ``Function output
(call_id <id>): <output>``, and the same for custom tools. System and developer messages stay
in the transcript, in their place: the engine's system turn (classifier instructions plus the
server's ``--context``) is pinned in the prefix cache at start-up and is the position the
trainer and calibration fitted, so a per-request system text there would change both; here
they are evidence about the conversation like any other turn. The chat template's own tool
turns are not used: the whole state sits inside one ``<document>`` of one user turn (the
engine's one-prefix design), where template markers would be neutralised anyway. Images
(``input_image``) are refused: this server serves text-only models. ``input_json`` parts
render as canonical JSON (a lone one is the state as a JSON value, as in System One).

Questions map one to one: ``predicate`` → ``noul`` (``probability`` is P(statement true)),
``choice`` → ``choice``, ``score`` → ``score``; they are keyed ``q0``, ``q1``, … inside (the
caller's ``name`` need not be unique and is not shown to the model) and answered in question
order. A choice option's name (shown to the model) is its value's text; a string whose text is
also a boolean value of the same question (``"true"`` beside ``true``) or that is blank shows
as JSON (``"true"`` with quotes), and any remaining clash gets `` #<position>``; answers carry
each value back with the JSON type it was sent with. A score level shows as ``label`` or
``label: description``; ``score`` is the expected level and ``probabilities[].value`` the
level's index, both **0-based** (System One's convention: levels 0 … n-1). An answer the
server abstained on (``--abstain-below``) is ``{"type": "refusal", "name"}``.

Unknown fields. Top level: a field that would change the answer and that onepass does not
implement (:data:`REFUSED_FIELDS`: sampling, reasoning, tools, instructions, conversation
state, streaming) is refused with a 400 naming it; System One's ``temperature`` and ``debias``
are onepass extensions and apply; any other field is accepted and ignored (metadata, user,
store, …). Inside questions, choices, levels, input items and parts, whose shapes are closed,
an unknown key is refused (most likely a misspelt one that matters, like ``descripton``).

Caching. ``prompt_cache_key`` partitions the prefix cache (requests with one key never reuse
another key's entries, nor those of requests without a key; the pinned system prompt is
shared); answers are the same with or without a hit. ``prompt_cache_options`` is checked
(``mode`` implicit/explicit, ``ttl`` "30m") and needs no action: onepass caches the rendered
state prefix whatever the mode, and explicit ``prompt_cache_breakpoint`` marks are accepted
and not needed. ``safety_identifier`` is checked (a string of at most 64 characters, as
Responses) and not used. Usage: ``input_tokens`` and ``cached_tokens`` as the engine counts
them (the shared prefix once plus every question's suffix; prefix tokens read from the
cache), ``cache_write_tokens`` the prefix tokens this request computed and stored in the
prefix cache, ``output_tokens`` one per question read from the model, no reasoning tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from onepass.contract import (
    MAX_CHOICE_OPTIONS,
    MAX_SCORE_LEVELS,
    ContractError,
    DecisionRequest,
    _describe,
    parse_request,
)
from onepass.prompt import render_content

MIN_QUESTIONS, MAX_QUESTIONS = 1, 400
MIN_CHOICES = 2
MIN_LEVELS = 2
MAX_SAFETY_IDENTIFIER = 64
MAX_CACHE_KEY = 1024
MAX_JSON_PART_BYTES = 256 * 1024
KNOWN_FIELDS = frozenset({
    "model", "input", "questions", "prompt_cache_key", "prompt_cache_options",
    "safety_identifier", "temperature", "debias",
})
REFUSED_FIELDS = frozenset({
    "top_p", "top_k", "min_p", "seed", "top_logprobs", "logprobs", "reasoning", "reasoning_effort",
    "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "response_format",
    "previous_response_id", "conversation", "prompt", "max_output_tokens", "max_tokens",
    "truncation", "include", "stream", "stream_options", "background", "logit_bias",
    "frequency_penalty", "presence_penalty", "n", "verbosity", "assets",
})
_ROLES = {"user": "User", "assistant": "Assistant", "system": "System",
          "developer": "Developer"}
_TEXT_ONLY = ("image inputs need a vision-language model; this server serves text-only "
              "models: send text (input_text) or JSON (input_json) parts")


@dataclass(frozen=True)
class Asked:
    """One question as the caller asked it: its System One key, and the values (choice) or
    labels (score) to name the answer with."""

    name: str | None
    key: str
    type: Literal["predicate", "choice", "score"]
    values: tuple[str | bool, ...] = ()
    options: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecisionsCall:
    """A validated body: the System One request the engine answers and the questions."""

    model: str
    system_one: dict[str, Any]
    request: DecisionRequest
    asked: tuple[Asked, ...]
    cache_key: str | None = None


# --------------------------------------------------------------------------- checks


def _string(value: Any, where: str, *, blank: bool = False) -> str:
    if not isinstance(value, str):
        raise ContractError(where, f"expected a string, got {_describe(value)}")
    if not blank and not value.strip():
        raise ContractError(where, "expected a non-empty string")
    return value


def _object(value: Any, where: str, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError(where, f"expected {what}, got {_describe(value)}")
    return value


def _closed(obj: dict[str, Any], where: str, allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise ContractError(f"{where}.{key}", "unknown field; expected only "
                                + ", ".join(sorted(allowed)))


def _optional(obj: dict[str, Any], key: str, where: str, choices: tuple[str, ...]) -> None:
    value = obj.get(key)
    if value is not None and value not in choices:
        got = repr(value) if isinstance(value, str) else _describe(value)
        raise ContractError(f"{where}.{key}", f"expected one of {', '.join(choices)}, got {got}")


def _breakpoint(part: dict[str, Any], where: str) -> None:
    mark = part.get("prompt_cache_breakpoint")
    if mark is not None:
        mark = _object(mark, f"{where}.prompt_cache_breakpoint")
        _closed(mark, f"{where}.prompt_cache_breakpoint", {"mode"})
        if mark.get("mode") != "explicit":
            raise ContractError(f"{where}.prompt_cache_breakpoint.mode", "expected 'explicit'")


def _json_data(part: dict[str, Any], where: str) -> Any:
    data = part.get("data")
    if not (isinstance(data, dict) or (isinstance(data, list) and data
                                       and all(isinstance(x, dict) for x in data))):
        raise ContractError(f"{where}.data", "expected a JSON object or an array of objects, "
                            f"got {_describe(data)}")
    size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_JSON_PART_BYTES:
        raise ContractError(f"{where}.data", f"{size} bytes of compact JSON is over the "
                            f"limit of {MAX_JSON_PART_BYTES}")
    return data


def _parts(value: Any, where: str, kinds: set[str], *, lone: bool = False) -> Any:
    """Text of a content string or list of parts (``kinds`` allowed), parts joined by a
    newline; with ``lone``, a single JSON part is its value (rendered as JSON)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ContractError(where, f"expected a string or a non-empty array of parts, got "
                            f"{_describe(value) if value != [] else 'an empty array'}")
    texts: list[Any] = []
    for i, raw in enumerate(value):
        at = f"{where}[{i}]"
        part = _object(raw, at, "a content part object")
        kind = part.get("type")
        if kind == "input_image":
            raise ContractError(f"{at}.type", _TEXT_ONLY, kind="unsupported_asset")
        if kind not in kinds:
            got = repr(kind) if isinstance(kind, str) else _describe(kind)
            raise ContractError(f"{at}.type", f"expected one of {', '.join(sorted(kinds))}, "
                                f"got {got}")
        if kind == "input_json":
            _closed(part, at, {"type", "data"})
            texts.append(_json_data(part, at))
        elif kind == "refusal":
            _closed(part, at, {"type", "refusal"})
            texts.append("Refusal: " + _string(part.get("refusal"), f"{at}.refusal", blank=True))
        else:  # input_text, output_text
            _closed(part, at, {"type", "text", "prompt_cache_breakpoint"}
                    if kind == "input_text" else {"type", "text"})
            _breakpoint(part, at)
            texts.append(_string(part.get("text"), f"{at}.text", blank=True))
    if lone and len(texts) == 1:
        return texts[0]
    return "\n".join(t if isinstance(t, str) else render_content(t) for t in texts)


# --------------------------------------------------------------------------- input

_MESSAGE_PARTS = {
    "user": {"input_text", "input_json"},
    "developer": {"input_text"},
    "system": {"input_text"},
    "assistant": {"output_text", "refusal"},
}
_CALLS = {"function_call": ("Function call", "arguments"),
          "custom_tool_call": ("Custom tool call", "input")}
_OUTPUTS = {"function_call_output": ("Function output", "function_call"),
            "custom_tool_call_output": ("Custom tool output", "custom_tool_call")}
_STATUS = ("in_progress", "completed", "incomplete")


def render_input(value: Any) -> Any:
    """The state for ``input``: a string as is, a list of items as a transcript (see the
    module docstring); a lone text user message is its text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ContractError("input", "expected a string or a non-empty array of input items, "
                            f"got {_describe(value) if value != [] else 'an empty array'}")
    blocks: list[str] = []
    calls: dict[str, tuple[str, int]] = {}  # call_id -> (item type, index)
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        item = _object(raw, where, "an input item object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                got = repr(role) if isinstance(role, str) else _describe(role)
                raise ContractError(f"{where}.role", "expected one of user, developer, system, "
                                    f"assistant, got {got}")
            _closed(item, where, {"type", "role", "content"} | (
                {"phase"} if role == "assistant" else set()))
            _optional(item, "phase", where, ("commentary", "final_answer"))
            if "content" not in item:
                raise ContractError(f"{where}.content", "field required")
            content = _parts(item["content"], f"{where}.content", _MESSAGE_PARTS[role],
                             lone=len(value) == 1 and role == "user")
            if len(value) == 1 and role == "user":
                return content  # the plain case: exactly what a string input reads
            blocks.append(f"{_ROLES[role]}: {content}")
        elif kind in _CALLS:
            title, body = _CALLS[kind]
            _closed(item, where, {"type", "call_id", "name", body, "id", "namespace", "status"})
            call_id = _string(item.get("call_id"), f"{where}.call_id")
            name = _string(item.get("name"), f"{where}.name")
            text = _string(item.get(body), f"{where}.{body}", blank=True)
            for key in ("id", "namespace"):
                if item.get(key) is not None:
                    _string(item[key], f"{where}.{key}", blank=True)
            _optional(item, "status", where, _STATUS)
            if call_id in calls:
                raise ContractError(f"{where}.call_id", f"call id {call_id!r} is already used "
                                    f"by input[{calls[call_id][1]}]")
            calls[call_id] = (kind, i)
            namespace = item.get("namespace")
            shown = f"{namespace}.{name}" if namespace else name
            blocks.append(f"{title} {shown} (call_id {call_id}): {text}")
        elif kind in _OUTPUTS:
            title, call_kind = _OUTPUTS[kind]
            _closed(item, where, {"type", "call_id", "output", "id", "status"})
            call_id = _string(item.get("call_id"), f"{where}.call_id")
            if calls.get(call_id, ("", 0))[0] != call_kind:
                raise ContractError(f"{where}.call_id", f"no earlier {call_kind} item has "
                                    f"call_id {call_id!r}; each output must follow its call")
            if item.get("id") is not None:
                _string(item["id"], f"{where}.id", blank=True)
            _optional(item, "status", where, _STATUS)
            if "output" not in item:
                raise ContractError(f"{where}.output", "field required")
            output = _parts(item["output"], f"{where}.output", {"input_text"})
            blocks.append(f"{title} (call_id {call_id}): {output}")
        else:
            got = repr(kind) if isinstance(kind, str) else _describe(kind)
            raise ContractError(f"{where}.type", "expected message, function_call, "
                                "function_call_output, custom_tool_call or "
                                f"custom_tool_call_output, got {got}")
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------- questions


def option_names(values: list[str | bool]) -> list[str]:
    """Distinct option names for typed choice values (see the module docstring)."""
    bools = {"true" if v else "false" for v in values if isinstance(v, bool)}
    used: set[str] = set()
    names = []
    for j, value in enumerate(values):
        if isinstance(value, bool):
            name = "true" if value else "false"
        elif not value.strip() or value in bools:
            name = json.dumps(value, ensure_ascii=False)
        else:
            name = value
        base, n = name, j + 1
        while name in used:
            name, n = f"{base} #{n}", n + 1
        used.add(name)
        names.append(name)
    return names


def _description(obj: dict[str, Any], where: str) -> str | None:
    value = obj.get("description")
    if value is None:
        return None
    text = _string(value, f"{where}.description", blank=True)
    return text if text.strip() else None


def _question(raw: Any, i: int) -> tuple[Asked, dict[str, Any]]:
    where = f"questions[{i}]"
    q = _object(raw, where, "a question object")
    kind = q.get("type")
    if kind not in ("predicate", "choice", "score"):
        got = repr(kind) if isinstance(kind, str) else _describe(kind)
        raise ContractError(f"{where}.type", f"expected predicate, choice or score, got {got}")
    extra = {"predicate": set(), "choice": {"choices"}, "score": {"levels"}}[kind]
    _closed(q, where, {"type", "name", "instructions"} | extra)
    name = q.get("name")
    if name is not None and not isinstance(name, str):
        raise ContractError(f"{where}.name", f"expected a string, got {_describe(name)}")
    if "instructions" not in q:
        raise ContractError(f"{where}.instructions", "field required")
    instructions = _parts(q["instructions"], f"{where}.instructions",
                          {"input_text", "input_json"}, lone=True)
    if isinstance(instructions, str) and not instructions.strip():
        raise ContractError(f"{where}.instructions", "expected non-empty instructions")
    key = f"q{i}"
    if kind == "predicate":
        return Asked(name, key, kind), {"type": "noul", "instructions": instructions}
    if kind == "choice":
        choices = q.get("choices")
        if not isinstance(choices, list):
            raise ContractError(f"{where}.choices", f"expected an array, got {_describe(choices)}")
        if not MIN_CHOICES <= len(choices) <= MAX_CHOICE_OPTIONS:
            raise ContractError(f"{where}.choices", f"expected {MIN_CHOICES} to "
                                f"{MAX_CHOICE_OPTIONS} choices, got {len(choices)}")
        values: list[str | bool] = []
        descriptions = []
        seen: dict[tuple[type, str | bool], int] = {}
        for j, raw_choice in enumerate(choices):
            at = f"{where}.choices[{j}]"
            choice = _object(raw_choice, at, "a choice object")
            _closed(choice, at, {"value", "description"})
            value = choice.get("value")
            if not isinstance(value, (str, bool)):
                raise ContractError(f"{at}.value", f"expected a string or a boolean, got "
                                    f"{_describe(value) if 'value' in choice else 'nothing'}")
            typed = (type(value), value)
            if typed in seen:
                raise ContractError(f"{at}.value", f"duplicate choice {json.dumps(value)}: "
                                    f"the same as {where}.choices[{seen[typed]}]")
            seen[typed] = j
            values.append(value)
            descriptions.append(_description(choice, at))
        options = option_names(values)
        return (Asked(name, key, kind, tuple(values), tuple(options)),
                {"type": "choice", "instructions": instructions,
                 "criteria": dict(zip(options, descriptions))})
    levels = q.get("levels")
    if not isinstance(levels, list):
        raise ContractError(f"{where}.levels", f"expected an array, got {_describe(levels)}")
    if not MIN_LEVELS <= len(levels) <= MAX_SCORE_LEVELS:
        raise ContractError(f"{where}.levels", f"expected {MIN_LEVELS} to {MAX_SCORE_LEVELS} "
                            f"levels (onepass reads a score from at most {MAX_SCORE_LEVELS}), "
                            f"got {len(levels)}")
    labels, shown = [], []
    for j, raw_level in enumerate(levels):
        at = f"{where}.levels[{j}]"
        level = _object(raw_level, at, "a level object")
        _closed(level, at, {"label", "description"})
        label = _string(level.get("label"), f"{at}.label")
        description = _description(level, at)
        labels.append(label)
        shown.append(f"{label}: {description}" if description else label)
    return (Asked(name, key, kind, labels=tuple(labels)),
            {"type": "score", "instructions": instructions, "criteria": shown})


# --------------------------------------------------------------------------- body


def _short_string(value: Any, field: str, limit: int) -> str | None:
    """An optional string of at most ``limit`` characters (None when absent)."""
    if value is None:
        return None
    _string(value, field, blank=True)
    if len(value) > limit:
        raise ContractError(field, f"expected at most {limit} characters, got {len(value)}")
    return value


def parse_body(raw: Any) -> DecisionsCall:
    """Validate a decoded body (no model work): every fault names its field."""
    body = _object(raw, "body", "a JSON object")
    for key in body:
        if key in REFUSED_FIELDS:
            raise ContractError(key, "not supported: onepass reads each answer from one "
                                "forward pass and implements no such parameter")
    if "model" not in body:
        raise ContractError("model", "field required")
    model = _string(body["model"], "model")
    if "input" not in body:
        raise ContractError("input", "field required")
    state = render_input(body["input"])
    questions = body.get("questions")
    if not isinstance(questions, list):
        raise ContractError("questions", "expected an array of 1 to 400 questions, got "
                            f"{_describe(questions) if 'questions' in body else 'nothing'}")
    if not MIN_QUESTIONS <= len(questions) <= MAX_QUESTIONS:
        raise ContractError("questions", f"expected {MIN_QUESTIONS} to {MAX_QUESTIONS} "
                            f"questions, got {len(questions)}")
    asked, wire = [], {}
    for i, q in enumerate(questions):
        one, question = _question(q, i)
        asked.append(one)
        wire[one.key] = question
    cache_key = _short_string(body.get("prompt_cache_key"), "prompt_cache_key", MAX_CACHE_KEY)
    options = body.get("prompt_cache_options")
    if options is not None:
        options = _object(options, "prompt_cache_options")
        _closed(options, "prompt_cache_options", {"mode", "ttl"})
        _optional(options, "mode", "prompt_cache_options", ("implicit", "explicit"))
        if "ttl" in options and options["ttl"] != "30m":
            got = options["ttl"]
            got = repr(got) if isinstance(got, str) else _describe(got)
            raise ContractError("prompt_cache_options.ttl",
                                f"expected '30m' (the only supported value), got {got}")
    _short_string(body.get("safety_identifier"), "safety_identifier", MAX_SAFETY_IDENTIFIER)
    system_one: dict[str, Any] = {"model": model, "state": state, "questions": wire}
    for key in ("temperature", "debias"):  # onepass extensions, checked by the contract
        if body.get(key) is not None:
            system_one[key] = body[key]
    try:
        request = parse_request(system_one)
    except ContractError as exc:  # a System One path -> the field the caller sent
        raise ContractError(caller_field(exc.field), exc.message, kind=exc.kind) from None
    request = DecisionRequest(request.model, request.state, request.questions,
                              request.temperature, request.debias, cache_key)
    return DecisionsCall(model, system_one, request, tuple(asked), cache_key)


def caller_field(field: str) -> str:
    """A System One field as the caller named it: ``questions.q3.criteria`` ->
    ``questions[3]``; ``state`` (a prompt over the token limit, say) -> ``input``."""
    if field == "state":
        return "input"
    if field.startswith("questions.q"):
        head = field.split(".")[1]
        if head[1:].isdigit():
            return f"questions[{head[1:]}]"
    return field


# --------------------------------------------------------------------------- response


def build_response(call: DecisionsCall, result: dict[str, Any]) -> dict[str, Any]:
    """The ``Decision`` object from the engine's System One answer (see the module
    docstring): answers in question order, usage in OpenAI's shape."""
    answers = []
    for q in call.asked:
        got = result["answers"][q.key]
        if got.get("abstained"):
            answers.append({"type": "refusal", "name": q.name})
        elif q.type == "predicate":
            answers.append({"type": "predicate", "name": q.name, "probability": got["noul"]})
        elif q.type == "choice":
            probs = got["probabilities"]
            answers.append({
                "type": "choice", "name": q.name,
                "choice": q.values[q.options.index(got["choice"])],
                "probabilities": [{"value": v, "probability": probs[o]}
                                  for v, o in zip(q.values, q.options)],
                "confidence": got["confidence"],
            })
        else:
            probs = got["probabilities"]
            answers.append({
                "type": "score", "name": q.name, "score": got["score"],
                "probabilities": [{"label": label, "value": i, "probability": probs[str(i)]}
                                  for i, label in enumerate(q.labels)],
                "confidence": got["confidence"],
            })
    usage = result.get("usage") or {}
    inputs, outputs = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return {
        "answers": answers,
        "model": result["model"],
        "usage": {
            "input_tokens": inputs,
            "input_tokens_details": {
                "cached_tokens": int(usage.get("cached_tokens") or 0),
                "cache_write_tokens": int(usage.get("cache_write_tokens") or 0),
            },
            "output_tokens": outputs,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inputs + outputs,
        },
    }


def is_legacy_schema_body(raw: Any) -> bool:
    """A JSON-Schema decisions body sent to ``/v1/decisions`` (before it moved to
    ``/v1/decisions/schema``): unambiguous only with ``schema`` and neither ``questions`` nor
    ``input``."""
    return isinstance(raw, dict) and "schema" in raw and not {"questions", "input"} & set(raw)


# --------------------------------------------------------------------------- wire schemas
# For the OpenAPI document only (validation: parse_body).

class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "input_json"]
    text: str | None = None
    data: JsonValue = None


class DecisionChoiceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str | bool = Field(description="Typed: the string 'true' and the boolean true are "
                              "distinct values")
    description: str | None = None


class DecisionLevelModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    description: str | None = None


class DecisionQuestionModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["predicate", "choice", "score"]
    name: str | None = None
    instructions: str | list[_Part]
    choices: list[DecisionChoiceModel] | None = Field(
        default=None, min_length=MIN_CHOICES, max_length=MAX_CHOICE_OPTIONS)
    levels: list[DecisionLevelModel] | None = Field(
        default=None, min_length=MIN_LEVELS, max_length=MAX_SCORE_LEVELS,
        description="Ordered lowest to highest; score and probabilities[].value are 0-based")


class OpenAIDecisionsRequestModel(BaseModel):
    """``POST /v1/decisions``: the OpenAI Decisions API body (``client.decisions.create``)."""

    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[dict[str, JsonValue]] = Field(
        description="A string, or messages (user/developer/system/assistant), function_call / "
        "function_call_output and custom_tool_call / custom_tool_call_output items; each "
        "output follows its call (call_id). Text only: input_image is refused")
    questions: list[DecisionQuestionModel] = Field(min_length=MIN_QUESTIONS,
                                                   max_length=MAX_QUESTIONS)
    prompt_cache_key: str | None = Field(default=None, description="Partitions the prefix "
                                         "cache: no other key's entries are reused")
    prompt_cache_options: dict[str, JsonValue] | None = None
    safety_identifier: str | None = Field(default=None, max_length=MAX_SAFETY_IDENTIFIER)


class DecisionUsageModel(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class OpenAIDecisionModel(BaseModel):
    """The ``Decision`` object: answers in question order (predicate, choice, score or
    refusal), the model, usage."""

    answers: list[dict[str, JsonValue]]
    model: str
    usage: DecisionUsageModel
