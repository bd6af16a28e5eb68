"""Function tools (pure): the ``tools``/``tool_choice`` fields, how the model is told about the
functions, the grammar that forces a call, and parsing the calls out of the generated text.

Rendering. A chat template that declares tools (its source mentions ``tools``) gets them
through ``apply_chat_template(..., tools=...)`` and the calls in its own format. A template
without tools (SmolLM2, Gemma 2/3, Llama 2) gets one portable instruction: a system block that
lists the functions as JSON inside ``<tools></tools>`` and asks for
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` — the Hermes/Qwen wording,
because it is what the most open checkpoints were tuned on. Earlier calls are written back in
that format and tool results as a user turn of ``<tool_response>`` blocks, so templates that
insist on alternating user/assistant turns still render.

Parsing. The formats recognised are the ones with explicit delimiters, so ordinary text (or
JSON content) is never mistaken for a call:

- Hermes/Qwen ``<tool_call>{json}</tool_call>`` (Qwen 2.5/3, Hermes, SmolLM3, and every
  template-less model through the portable instruction);
- Mistral ``[TOOL_CALLS][{"name", "arguments"}, ...]`` (also ``[TOOL_CALLS]name[ARGS]{...}``);
- Llama 3.x ``<|python_tag|>{"name", "parameters"}`` and, only for a Llama template (selected
  by :func:`native_format`), a whole reply that is one ``{"name", "parameters"}`` object.

Gemma 2/3 templates declare no tools (Gemma's own guidance is a prompt convention), so Gemma
uses the portable instruction and its Hermes calls. A completed call that does not parse, names
an unknown function, or whose arguments are not an object (or break a ``strict`` schema) is a
:class:`MalformedCall`: the route answers 502 ``invalid_model_output`` and never passes it on.

References. A parameters schema is checked and used on the server, so it may only refer to
itself: every ``$ref`` is a JSON pointer into the same schema (``#``, ``#/$defs/...``,
``#/definitions/...``, ``#/properties/...``) that points at a schema; a URL, a file, a relative
path, a URN or an anchor is refused (400 naming the ``$ref``), and so are ``$id`` (it rebases
every reference under it), ``$dynamicRef``/``$recursiveRef`` (resolved through the dynamic
scope) and a ``$schema`` other than the dialects that use ``$id`` (draft-04's ``id`` rebases
too). Calls are validated through a :data:`LOCAL_ONLY` registry whose retrieval refuses every
URI, so even a form the check missed never reaches the network or the disk.

Patterns. A parameters schema's ``pattern``/``patternProperties`` are the client's regular
expressions, matched against the model's arguments. jsonschema matches them with Python's
``re``, which backtracks without bound while holding the GIL (``^(a|a)*$`` froze the whole
server), so calls are validated by :func:`validate_call`, whose validator matches with
``regex`` under a timeout and releases the GIL; a pattern too slow for the arguments is a
400 naming it. At parse time :func:`check_patterns` bounds each pattern's length and what the
request's patterns unroll to when compiled.

Size: rendering, forcing and parsing of tool calls change together with each call format
(portable, template-native, Responses items), so they stay in one pure module.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import referencing
import referencing.exceptions
import regex

from onepass.contract import ContractError, _describe
from onepass.generate.grammar import check_schema_bounds

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("auto", "none", "required")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_CALLS = "[TOOL_CALLS]"
LLAMA_TAG = "<|python_tag|>"
# x-guidance settings every forced call is generated under (nothing loosened, compact JSON)
_STRICT_JSON = {"whitespace_flexible": False, "lenient": False, "coerce_one_of": False}


class MalformedCall(ValueError):
    """A completed tool call the client must not receive (502 invalid_model_output)."""


@dataclass(frozen=True)
class Function:
    """One declared function tool."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool
    field: str = "parameters"  # where the request declared ``parameters`` (errors name it)

    def chat_tool(self) -> dict[str, Any]:
        """The Chat Completions shape (what templates and the instruction show the model)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}

    def responses_tool(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": dict(self.parameters), "strict": self.strict}


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools and how they may be used. ``choice``: auto, none, required or
    function (then ``named`` is the function)."""

    functions: tuple[Function, ...]
    choice: str
    named: str | None
    parallel: bool

    @property
    def active(self) -> bool:
        """The model is shown the tools and its calls are parsed."""
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """A call is forced by the grammar."""
        return self.active and self.choice in ("required", "function")

    def function(self, name: str) -> Function | None:
        return next((f for f in self.functions if f.name == name), None)

    def choice_wire(self, dialect: str) -> Any:
        """``tool_choice`` as a response echoes it."""
        if self.choice != "function":
            return self.choice
        if dialect == "responses":
            return {"type": "function", "name": self.named}
        return {"type": "function", "function": {"name": self.named}}


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is compact JSON text of an object."""

    id: str
    name: str
    arguments: str


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------- the request


def parse_tool_request(
    tools: Any, tool_choice: Any, parallel: Any, *, dialect: str = "chat",
) -> ToolSpec | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat (``dialect`` chat) or
    responses body; None when no tools are given (then a tool_choice other than none/auto
    is refused: it names nothing)."""
    functions = parse_tools(tools, dialect=dialect)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise ContractError("parallel_tool_calls", f"expected true or false, got "
                            f"{_describe(parallel)}")
    choice, named = parse_tool_choice(tool_choice, functions, dialect=dialect)
    if not functions:
        return None
    return ToolSpec(functions, choice, named, parallel)


def parse_tools(raw: Any, *, dialect: str = "chat") -> tuple[Function, ...]:
    """The ``tools`` array: function tools only (Chat: ``{"type": "function", "function":
    {name, description, parameters, strict}}``; Responses: those keys beside ``type``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ContractError("tools", f"expected an array of function tools, got "
                            f"{_describe(raw)}")
    if len(raw) > MAX_TOOLS:
        raise ContractError("tools", f"{len(raw)} tools is over the limit of {MAX_TOOLS}")
    out: list[Function] = []
    patterns = PatternBudget()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ContractError(where, f"expected a function tool object, got {_describe(tool)}")
        if tool.get("type") != "function":
            raise ContractError(f"{where}.type", f"only function tools are supported, got "
                                f"{_describe(tool.get('type'))}")
        if dialect == "chat":
            _only(tool, {"type", "function"}, where)
            body, at = tool.get("function"), f"{where}.function"
            if not isinstance(body, Mapping):
                raise ContractError(at, f"expected an object {{name, description, parameters}}, "
                                    f"got {_describe(body)}")
            _only(body, {"name", "description", "parameters", "strict"}, at)
        else:
            body, at = tool, where
            _only(body, {"type", "name", "description", "parameters", "strict"}, at)
        name = body.get("name")
        if not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ContractError(f"{at}.name", "expected 1 to 64 letters, digits, '_' or '-', "
                                f"got {_describe(name)}")
        if any(f.name == name for f in out):
            raise ContractError(f"{at}.name", f"function {name!r} is declared twice")
        description = body.get("description")
        if description is not None and not isinstance(description, str):
            raise ContractError(f"{at}.description", f"expected a string, got "
                                f"{_describe(description)}")
        parameters = body.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ContractError(f"{at}.parameters", "expected a JSON Schema of type object, got "
                                f"{_describe(parameters)}")
        strict = body.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ContractError(f"{at}.strict", f"expected a boolean, got {_describe(strict)}")
        check_schema_bounds(parameters, f"{at}.parameters")  # before any walk: depth, size
        check_patterns(parameters, f"{at}.parameters", patterns)  # before re.compile sees them
        _check_schema(parameters, f"{at}.parameters")
        check_references(parameters, f"{at}.parameters")
        out.append(Function(name, description, parameters, bool(strict), f"{at}.parameters"))
    return tuple(out)


def parse_tool_choice(
    raw: Any, functions: Sequence[Function], *, dialect: str = "chat",
) -> tuple[str, str | None]:
    """(choice, named function): auto (the default with tools), none, required, or a
    function that must be among ``tools``."""
    if raw is None:
        return ("auto" if functions else "none"), None
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise ContractError("tool_choice", "expected auto, none, required or a named "
                                f"function, got {raw!r}")
        if raw == "required" and not functions:
            raise ContractError("tool_choice", "required needs at least one function in tools")
        return raw, None
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        raise ContractError("tool_choice", "expected auto, none, required or "
                            '{"type": "function", ...}, got ' + _describe(raw))
    if dialect == "chat":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        where = "tool_choice.function.name"
    else:
        name, where = raw.get("name"), "tool_choice.name"
    if not isinstance(name, str):
        raise ContractError(where, f"expected a function name, got {_describe(name)}")
    if not any(f.name == name for f in functions):
        known = ", ".join(f.name for f in functions) or "none"
        raise ContractError(where, f"unknown function {name!r}; tools declares: {known}")
    return "function", name


def _only(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(str(k) for k in raw if k not in allowed)
    if extra:
        raise ContractError(where, f"unknown key(s) {', '.join(extra)}; expected only "
                            f"{', '.join(sorted(allowed))}")


def _check_schema(schema: Mapping[str, Any], where: str) -> None:
    """A parameters schema must itself be a valid JSON Schema (it is used to validate)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        raise ContractError(where, f"not a valid JSON Schema: {exc.message}") from None


# every dialect that names its base URI ``$id`` (refused below); draft-03/04 rebase with ``id``
_DIALECTS = frozenset(
    f"{base}{tail}" for base in ("https://json-schema.org/draft/2020-12/schema",
                                 "https://json-schema.org/draft/2019-09/schema",
                                 "http://json-schema.org/draft-07/schema",
                                 "http://json-schema.org/draft-06/schema") for tail in ("", "#"))
_REBASING = {
    "$id": "'$id' changes the base every reference under it resolves against",
    "$dynamicRef": "'$dynamicRef' resolves through the dynamic scope",
    "$recursiveRef": "'$recursiveRef' resolves through the dynamic scope",
}


def check_references(schema: Mapping[str, Any], where: str) -> None:
    """Refuse every reference that could leave ``schema`` (see the module's References):
    ``$ref`` must be a JSON pointer into ``schema`` naming a schema. Every object in the
    document is looked at, values of ``const``/``enum``/``default`` too (a pointer may reach
    anywhere), iteratively, so a deep schema cannot exhaust the stack here."""
    for node, at in _objects(schema, where):
        for key, value in node.items():
            if not isinstance(value, str):  # a schema keyword here (objects are subschemas)
                continue
            field = f"{at}.{key}"
            if key == "$ref":
                _check_pointer(schema, value, field)
            elif key in _REBASING:
                raise ContractError(field, f"{_REBASING[key]}; only local '$ref' "
                                    "pointers ('#/$defs/...') are supported")
            elif key == "$schema" and value not in _DIALECTS:
                raise ContractError(field, f"unsupported dialect {value[:100]!r}; "
                                    "expected JSON Schema 2020-12 (or omit $schema)")
    _check_expansion(schema, where)


def _objects(schema: Any, where: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Every object in a schema document with its path, data included (a ``$ref`` may point
    anywhere, so any object may be used as a schema); iterative, so depth cannot overflow."""
    stack: list[tuple[Any, str]] = [(schema, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(node))
        elif isinstance(node, Mapping):
            yield node, at
            stack.extend((value, f"{at}.{key}") for key, value in node.items()
                         if isinstance(value, (Mapping, list)))


MAX_EXPANDED = 20_000
"""Subschemas one call's validation may visit with every ``$ref`` expanded where it is used
(a recursive reference counts once: the instance bounds it). References that fan out (each
definition using the one before twice) would otherwise cost 2^depth checks per call while
staying a few hundred bytes; real tool schemas expand to hundreds."""
_DATA = frozenset({"const", "enum", "default", "examples", "$defs", "definitions"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})


def _check_expansion(schema: Mapping[str, Any], where: str) -> None:
    """Refuse a schema that expands past :data:`MAX_EXPANDED` subschemas (pointers are
    already checked; each target is measured once, so this costs the document's size)."""
    measured: dict[int, int] = {}
    open_targets: set[int] = set()

    def size(node: Any) -> int:
        if isinstance(node, list):
            return sum(size(item) for item in node)
        if not isinstance(node, Mapping):
            return 0
        total = 1
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _pointer_target(schema, ref)
            key = id(target)
            if key in open_targets:
                total += 1  # recursion: each level is paid for by the instance
            else:
                if key not in measured:
                    open_targets.add(key)
                    measured[key] = size(target)
                    open_targets.discard(key)
                total += measured[key]
        for keyword, value in node.items():
            if keyword in _DATA:
                continue
            if keyword in _SCHEMA_MAPS and isinstance(value, Mapping):  # any names, even "enum"
                total += sum(size(sub) for sub in value.values())
            elif isinstance(value, (Mapping, list)):
                total += size(value)
        if total > MAX_EXPANDED:
            raise ContractError(where, f"its references expand to over {MAX_EXPANDED:,} "
                                "subschemas (each '$ref' counts wherever it is used, so "
                                "references that fan out multiply); use fewer or less nested "
                                "references")
        return total

    try:
        size(schema)
    except RecursionError:
        raise ContractError(where, "nested too deeply to validate calls against") from None


def _pointer_target(schema: Mapping[str, Any], ref: str) -> Any:
    """What the local pointer ``ref`` names in ``schema`` (KeyError/IndexError: nothing)."""
    target: Any = schema
    for token in unquote(ref[1:]).split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping):
            target = target[token]
        elif (isinstance(target, list) and token.isdigit() and token.isascii()
              and (token == "0" or token[0] != "0")):
            target = target[int(token)]
        else:
            raise KeyError(token)
    return target


def _check_pointer(schema: Mapping[str, Any], ref: str, field: str) -> None:
    """``ref`` is ``#`` or ``#/...`` (a JSON pointer, percent-decoded as jsonschema reads it)
    and points at a schema (an object or a boolean) inside ``schema``."""
    shown = ref if len(ref) <= 100 else ref[:100] + "..."
    if not ref.startswith("#"):
        raise ContractError(field, f"only local '$ref' pointers ('#/$defs/...') are "
                            f"supported, got {shown!r}; the server never fetches a URL or "
                            "reads a file")
    if len(ref) > 1 and not ref.startswith("#/"):
        raise ContractError(field, f"'$ref' {shown!r} names an anchor; only JSON pointers "
                            "('#/$defs/...') are supported")
    try:
        target = _pointer_target(schema, ref)
    except (KeyError, IndexError):
        raise ContractError(field, f"'$ref' {shown!r} points at nothing in this schema") from None
    if not isinstance(target, (Mapping, bool)):
        raise ContractError(field, f"'$ref' {shown!r} points at {_describe(target)}, not a "
                            "schema")


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    """Every URI a validation would fetch: refused (references are local or nothing)."""
    raise referencing.exceptions.NoSuchResource(ref=uri)


LOCAL_ONLY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)
"""The registry calls are validated through: it retrieves nothing, ever."""


# --------------------------------------------------------------------------- patterns

try:
    from re import _parser as _sre_parse  # Python 3.11+: the parser re.compile runs first
except ImportError:  # pragma: no cover (Python 3.10)
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_PATTERN = 1_000
"""Characters one ``pattern`` (or ``patternProperties`` key) may have."""
MAX_PATTERN_WORK = 20_000
"""What all the patterns of one request's ``tools`` may expand to when compiled (each
quantified part counted ``min + 1`` times, nested quantifiers multiplied). The ``regex``
module unrolls counted repeats: ``(?:a{1000}){1000}`` (17 characters) takes 0.9 s and 270 MB
to compile, ``a{65535}`` x 100 6 s and 1.7 GB, all holding the GIL; 20,000 is ~20 ms."""
MATCH_SECONDS = 0.1
"""CPU time one pattern match may take (``regex``'s timeout, counted in process CPU time)."""
CALL_MATCH_SECONDS = 1.0
"""Wall time all the matches of validating one call may take together."""
_REPEATS = tuple(getattr(_sre_parse, name) for name in
                 ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre_parse, name))
_CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "onepass_tool_call_match_deadline", default=None)


class PatternBudget:
    """The expansion the patterns of one request's tools have used so far."""

    def __init__(self) -> None:
        self.spent = 0


class SlowPattern(Exception):
    """A client pattern did not finish matching the model's argument within its time."""

    def __init__(self, pattern: str, keyword: str) -> None:
        super().__init__(pattern)
        self.pattern, self.keyword = pattern, keyword


def check_patterns(schema: Mapping[str, Any], where: str, budget: PatternBudget) -> None:
    """Refuse a ``pattern`` or ``patternProperties`` key that is too long, is not a regular
    expression, or would take too much to compile (``budget``: the request's tools
    together); and ``unevaluatedProperties`` beside ``patternProperties``, whose keys
    jsonschema would match with Python's ``re``, unbounded (calls are matched with ``regex``
    under a timeout, :func:`validate_call`)."""
    unevaluated, pattern_maps = None, False
    for node, at in _objects(schema, where):
        found = node.get("pattern")
        if isinstance(found, str):
            _check_pattern(found, f"{at}.pattern", budget)
        keyed = node.get("patternProperties")
        if isinstance(keyed, Mapping):
            pattern_maps = True
            for key in keyed:
                field = (f"{at}.patternProperties.{key}" if len(key) <= 100
                         else f"{at}.patternProperties")
                _check_pattern(str(key), field, budget)
        if "unevaluatedProperties" in node and unevaluated is None:
            unevaluated = f"{at}.unevaluatedProperties"
    if unevaluated is not None and pattern_maps:
        raise ContractError(unevaluated, "unevaluatedProperties is not supported in a schema "
                            "that uses patternProperties (its keys could not be matched "
                            "within a time bound); use additionalProperties")


def _check_pattern(pattern: str, field: str, budget: PatternBudget) -> None:
    if len(pattern) > MAX_PATTERN:
        raise ContractError(field, f"a pattern of {len(pattern):,} characters is over the "
                            f"limit of {MAX_PATTERN:,}")
    try:
        work = _expansion(_sre_parse.parse(pattern))
    except re.error as exc:
        raise ContractError(field, f"not a regular expression: {exc}") from None
    except RecursionError:
        raise ContractError(field, "the pattern is nested too deeply") from None
    budget.spent += work
    if budget.spent > MAX_PATTERN_WORK:
        raise ContractError(field, f"the patterns in tools expand to over "
                            f"{MAX_PATTERN_WORK:,} parts when compiled (each counted "
                            "repeat is unrolled: nested or large repeat counts multiply); "
                            "use smaller repeat counts")
    try:
        regex.compile(pattern)  # what calls are matched with; cached for them
    except (regex.error, ValueError, OverflowError) as exc:
        raise ContractError(field, f"not a regular expression the server can match: "
                            f"{exc}") from None


def _expansion(parsed: Any) -> int:
    """An upper bound on how many parts ``parsed`` (Python's parse of a pattern) unrolls to:
    a repeat ``{lo,hi}`` costs its body ``lo + 1`` times, everything else once."""
    total = 0
    for op, arg in parsed:
        if op in _REPEATS:
            low, _, body = arg
            total += _expansion(body) * (min(low, MAX_PATTERN_WORK) + 1)
        else:
            total += 1 + sum(_expansion(sub) for sub in _subpatterns(arg))
        if total > MAX_PATTERN_WORK:
            return total
    return total


def _subpatterns(arg: Any) -> Iterator[Any]:
    """The nested parses in one parsed item's argument (groups, branches, assertions)."""
    if isinstance(arg, _sre_parse.SubPattern):
        yield arg
    elif isinstance(arg, (tuple, list)):
        for item in arg:
            yield from _subpatterns(item)


def _search(pattern: str, text: str, keyword: str) -> bool:
    """``re.search`` semantics through ``regex``: bounded by :data:`MATCH_SECONDS` and the
    call's deadline, and the GIL released while it matches (Python's ``re`` holds it, so one
    backtracking match froze every thread of the server)."""
    seconds = MATCH_SECONDS
    deadline = _CALL_DEADLINE.get()
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
        if seconds <= 0:
            raise SlowPattern(pattern, keyword)
    try:
        return regex.search(pattern, text, timeout=seconds) is not None
    except TimeoutError:
        raise SlowPattern(pattern, keyword) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance, "pattern"):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key, "patternProperties"):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Any) -> Iterator[Any]:
    """jsonschema's ``additionalProperties``, its keys matched by :func:`_search`."""
    from jsonschema._utils import extras_msg
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {key for key in instance if key not in properties and not any(
        _search(pattern, key, "patternProperties") for pattern in patterns)}
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            shown, verb = extras_msg(sorted(extras, key=str))
            yield ValidationError(f"Additional properties are not allowed ({shown} {verb} "
                                  "unexpected)")


@functools.cache
def _call_validator() -> Any:
    """Draft 2020-12 with every client pattern matched by :func:`_search` (``pattern``,
    ``patternProperties``, and the keys ``additionalProperties`` weighs against them;
    ``unevaluatedProperties`` beside patterns is refused by :func:`check_patterns`)."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(Draft202012Validator, {
        "pattern": _pattern, "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties})


def _pattern_field(fn: Function, slow: SlowPattern) -> str:
    """Where ``fn``'s parameters declare the pattern that was too slow (its first place)."""
    for node, at in _objects(fn.parameters, fn.field):
        if slow.keyword == "pattern" and node.get("pattern") == slow.pattern:
            return f"{at}.pattern"
        keyed = node.get("patternProperties")
        if isinstance(keyed, Mapping) and slow.pattern in keyed:
            key = slow.pattern
            return f"{at}.patternProperties.{key}" if len(key) <= 100 else \
                f"{at}.patternProperties"
    return fn.field


def validate_call(fn: Function, args: Mapping[str, Any]) -> str | None:
    """Why ``args`` break ``fn``'s parameters (None: they do not). Nothing is retrieved
    (:data:`LOCAL_ONLY`) and every pattern is matched under a time bound: one too slow for
    the model's argument is the client's fault, a :class:`ContractError` naming it."""
    validator = _call_validator()(dict(fn.parameters), registry=LOCAL_ONLY)
    token = _CALL_DEADLINE.set(time.monotonic() + CALL_MATCH_SECONDS)
    try:
        error = next(iter(validator.iter_errors(args)), None)
    except referencing.exceptions.Unresolvable:  # refused at parse time; never fetched
        raise MalformedCall(f"the parameters schema of {fn.name} has a reference that does "
                            "not resolve inside it") from None
    except SlowPattern as slow:
        raise ContractError(_pattern_field(fn, slow), (
            f"the pattern {slow.pattern[:100]!r} did not finish matching the model's "
            f"arguments to {fn.name} within its time ({MATCH_SECONDS} s a match, "
            f"{CALL_MATCH_SECONDS} s a call), so the call could not be checked; use a "
            "pattern without nested or overlapping repeats")) from None
    finally:
        _CALL_DEADLINE.reset(token)
    return None if error is None else error.message


# --------------------------------------------------------------------------- rendering


def template_declares_tools(template: str | None) -> bool:
    """The chat template renders a ``tools`` variable (else: the portable instruction)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def native_format(template: str | None) -> str:
    """Which call format a template's model writes: hermes, mistral or llama."""
    text = template or ""
    if not template_declares_tools(text) or CALL_OPEN in text:
        return "hermes"
    if MISTRAL_CALLS in text:
        return "mistral"
    if LLAMA_TAG in text or "<|eom_id|>" in text or "ipython" in text:
        return "llama"
    return "hermes"


def instruction(spec: ToolSpec) -> str:
    """The portable system block: the functions as JSON and the exact call format."""
    listed = "\n".join(json.dumps(f.chat_tool(), ensure_ascii=False) for f in spec.functions)
    how = ("Call a function only when it helps answer the user." if spec.choice == "auto"
           else "You must call a function now.")
    if spec.choice == "function":
        how = f"You must call the function {spec.named} now."
    many = ("one <tool_call></tool_call> block per call" if spec.parallel
            else "one <tool_call></tool_call> block (a single call)")
    return (
        "# Tools\n\nYou may call functions to help answer the user. The functions are "
        "described in JSON Schema inside <tools></tools>:\n<tools>\n" + listed + "\n</tools>\n\n"
        f"{how} To call a function, reply with {many}, each holding a JSON object with the "
        "function's name and its arguments:\n<tool_call>\n"
        '{"name": "<function-name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
        "A function's result comes back in a <tool_response></tool_response> block."
    )


def portable_messages(messages: Sequence[Mapping[str, Any]],
                      spec: ToolSpec | None) -> list[dict[str, str]]:
    """Messages (normalised, assistant ``tool_calls`` kept) as plain role/content turns for
    a template without tools: the instruction joins the first system message (or becomes
    one), calls are written as ``<tool_call>`` blocks, tool results as one user turn."""
    out: list[dict[str, str]] = []
    block = instruction(spec) if spec is not None and spec.active else None
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [f"{CALL_OPEN}\n" + json.dumps(
                {"name": c["name"], "arguments": json.loads(c["arguments"])},
                ensure_ascii=False) + f"\n{CALL_CLOSE}" for c in message["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        elif role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + response
                continue
            out.append({"role": "user", "content": response, "_tool": "1"})
            continue
        out.append({"role": role, "content": content})
    for message in out:
        message.pop("_tool", None)
    if block is not None:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def native_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that declares tools: calls as HF templates expect them
    (``{"type": "function", "function": {"name", "arguments": <object>}}``)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {k: v for k, v in message.items() if k != "tool_calls"}
        if message.get("tool_calls"):
            item["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.loads(c["arguments"])}}
                for c in message["tool_calls"]]
        out.append(item)
    return out


def check_tool_turns(messages: Sequence[Mapping[str, Any]], field: str = "messages", *,
                     indexed: bool = True) -> None:
    """Every tool result answers a call of the assistant turn before it, and every call of
    that turn is answered before the conversation goes on. ``indexed``: name the message
    (``messages[3]``); else only ``field`` (Responses items do not map one to one)."""
    pending: dict[str, str] = {}
    for i, message in enumerate(messages):
        role = message["role"]
        where = f"{field}[{i}]" if indexed else field
        if role == "tool":
            call_id = message.get("tool_call_id")
            at = f"{where}.tool_call_id" if indexed else field
            if call_id is None:
                raise ContractError(at, "a tool message needs the tool_call_id of the call it "
                                    "answers")
            if call_id not in pending:
                raise ContractError(at, f"no pending tool call {call_id!r} in the assistant "
                                    "turn before it")
            del pending[call_id]
            continue
        if pending:
            missing = ", ".join(sorted(pending))
            raise ContractError(where, f"tool call(s) {missing} have no result yet; send one "
                                "result per call first")
        if role == "assistant":
            pending = {c["id"]: c["name"] for c in message.get("tool_calls") or ()}


def parse_assistant_calls(raw: Any, field: str) -> list[dict[str, str]]:
    """An assistant message's ``tool_calls`` (Chat shape) as ``{id, name, arguments}``."""
    if not isinstance(raw, list) or not raw:
        raise ContractError(field, "expected a non-empty array of tool calls")
    calls = []
    for j, call in enumerate(raw):
        where = f"{field}[{j}]"
        if not isinstance(call, Mapping) or call.get("type", "function") != "function":
            raise ContractError(where, "expected {id, type: function, function: {name, "
                                "arguments}}")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise ContractError(f"{where}.function", "expected {name, arguments}")
        calls.append(call_record(call.get("id"), fn.get("name"), fn.get("arguments"),
                                 id_field=f"{where}.id", fn_field=f"{where}.function"))
    return calls


def call_record(call_id: Any, name: Any, arguments: Any, *, id_field: str,
                fn_field: str) -> dict[str, str]:
    """One earlier call sent back by the client, checked: id, name, arguments (a JSON object
    as text)."""
    if not isinstance(call_id, str) or not call_id:
        raise ContractError(id_field, "expected the call's id (a non-empty string)")
    if not isinstance(name, str) or not name:
        raise ContractError(f"{fn_field}.name", "expected the function's name")
    if not isinstance(arguments, str):
        raise ContractError(f"{fn_field}.arguments", "expected the arguments as a JSON string")
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        raise ContractError(f"{fn_field}.arguments", "not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ContractError(f"{fn_field}.arguments", "expected a JSON object")
    return {"id": call_id, "name": name, "arguments": arguments}


# --------------------------------------------------------------------------- forcing a call


MAX_PARALLEL_CALLS = 8
"""Calls one forced (``required``) turn may make when parallel calls are allowed."""


def call_grammar(spec: ToolSpec) -> str:
    """A Lark grammar (llguidance) whose sentences are exactly well-formed Hermes calls:
    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, the arguments valid
    under the function's parameters schema. A named function: one call; ``required``: one, or
    up to :data:`MAX_PARALLEL_CALLS` when parallel calls are allowed.

    Each function's parameters sit in the wrapper as an embedded resource of their own (an
    ``$id`` the server chose; a client's ``$id`` is refused), so their local pointers
    (``#/$defs/...``, what pydantic emits) resolve inside them as they would at the root."""
    names = [spec.named] if spec.choice == "function" else [f.name for f in spec.functions]
    variants = []
    for name in names:
        fn = spec.function(name)
        assert fn is not None
        arguments = {**fn.parameters, "$id": f"urn:onepass:tool:{name}"}
        variants.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False,
        })
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {**schema, "x-guidance": _STRICT_JSON}
    # a named function is called once; required may call several when parallel calls are on,
    # at most MAX_PARALLEL_CALLS: a small model forced to call tends to call again forever
    many = spec.parallel and spec.choice == "required"
    repeat = f' ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if many else ""
    return (f"start: call{repeat}\n"
            f'call: "{CALL_OPEN}\\n" body "\\n{CALL_CLOSE}"\n'
            f"body: %json {json.dumps(schema, ensure_ascii=False)}\n")


# --------------------------------------------------------------------------- parsing


def parse_calls(text: str, spec: ToolSpec, fmt: str = "hermes") -> tuple[str, list[ToolCall]]:
    """(content, calls) of a completed reply. ``content`` is the text outside the calls
    (stripped); a malformed or unknown call raises :class:`MalformedCall`."""
    if CALL_OPEN in text:
        content, raw = _hermes(text)
    elif MISTRAL_CALLS in text:
        content, raw = _mistral(text)
    elif LLAMA_TAG in text:
        head, _, body = text.partition(LLAMA_TAG)
        content, raw = head, [_json(body.strip(), "the <|python_tag|> call")]
    elif fmt == "llama" and text.strip().startswith("{") and '"name"' in text:
        content, raw = "", [_json(text.strip(), "the Llama JSON call")]
    else:
        return text, []
    calls = [_check_call(obj, spec) for obj in raw]
    if not spec.parallel and len(calls) > 1:
        raise MalformedCall(f"the model made {len(calls)} calls but parallel_tool_calls is "
                            "false")
    return content.strip(), calls


def content_before_calls(text: str) -> str:
    """A reply cut at its output limit: the text before any call began (calls withheld)."""
    cut = len(text)
    for marker in (CALL_OPEN, MISTRAL_CALLS, LLAMA_TAG):
        at = text.find(marker)
        if at != -1:
            cut = min(cut, at)
    return text[:cut].strip() if cut < len(text) else text


def _hermes(text: str) -> tuple[str, list[Any]]:
    content, raw, rest = [], [], text
    while CALL_OPEN in rest:
        before, _, after = rest.partition(CALL_OPEN)
        content.append(before)
        body, closed, rest = after.partition(CALL_CLOSE)
        if not closed:
            raise MalformedCall("a <tool_call> block is not closed")
        raw.append(_json(body.strip(), "a <tool_call> block"))
    content.append(rest)
    return "".join(content), raw


def _mistral(text: str) -> tuple[str, list[Any]]:
    head, _, body = text.partition(MISTRAL_CALLS)
    body = body.strip()
    if "[ARGS]" in body:  # newer form: name[ARGS]{...}, repeated
        raw = []
        for part in body.split(MISTRAL_CALLS):
            name, sep, args = part.partition("[ARGS]")
            if not sep:
                raise MalformedCall("a [TOOL_CALLS] call without [ARGS]")
            raw.append({"name": name.strip(), "arguments": _json(args.strip(), "[ARGS]")})
        return head, raw
    found = _json(body, "the [TOOL_CALLS] array")
    return head, found if isinstance(found, list) else [found]


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"{what} is not valid JSON ({exc.msg})") from None


def _check_call(obj: Any, spec: ToolSpec) -> ToolCall:
    if not isinstance(obj, Mapping):
        raise MalformedCall(f"a call is not a JSON object: {_describe(obj)}")
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters"))
    if not isinstance(name, str):
        raise MalformedCall("a call has no function name")
    fn = spec.function(name)
    if fn is None:
        raise MalformedCall(f"the model called an unknown function {name!r}")
    if spec.choice == "function" and name != spec.named:
        raise MalformedCall(f"the model called {name!r}, not the required {spec.named!r}")
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _json(args, f"the arguments of {name}")
    if not isinstance(args, Mapping):
        raise MalformedCall(f"the arguments of {name} are not a JSON object")
    if fn.strict or spec.forced:
        error = validate_call(fn, args)
        if error is not None:
            raise MalformedCall(f"the arguments of {name} break its parameters schema: "
                                f"{error}")
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False,
                                                    separators=(",", ":")))
