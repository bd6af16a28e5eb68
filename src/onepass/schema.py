"""Ordered JSON-Schema decisions: every field of a schema, in declared order, is one restricted
label readout on the System One prompt path, so every returned value is a declared value.

A schema compiles (pure, no torch) into fields with finite domains: ``enum``/``const`` values,
booleans, score levels (``x-score`` or a bounded number with a step) and nested objects,
flattened in order. A field with no finite domain is refused, naming it, unless it is declared
open (``"x-open": true``): then one more candidate, the escape, is offered, and only when it wins
is a value generated (greedily; ``sample`` draws among the candidates only):

* a string with no constraint, or ``maxLength`` alone, is generated freely, stopped at its
  closing quote and cut at ``maxLength`` (which always satisfies it);
* a string with ``pattern``, ``format`` or ``minLength`` is generated under the grammar engine
  (:mod:`onepass.generate.grammar`, llguidance) with every one of its keywords, ``maxLength``
  included, so the value validates; an ``enum`` beside them must obey them too;
* an ``integer``/``number`` (no ``x-score``) is generated under the grammar within its
  ``minimum``/``maximum``/``exclusive*``/``multipleOf`` and returned as a JSON number (an int
  for ``integer``): directly without an ``enum``, through the escape with one. An enumerable
  range without ``x-open`` stays score levels.

The grammars are compiled for the model's vocabulary by :func:`plan_decisions`, before any
model work: what llguidance cannot enforce (an unknown ``format``, look-around in a
``pattern``) is a :class:`ContractError` naming the field and the keyword, never loosened. A
string's prompt ends with ``lead + '"'`` exactly as on the free branch (the matcher is advanced
past the quote); a number's ends before ``lead``, which its grammar then requires. A constrained
value the token bound (``max_open_tokens``, ``maxLength + 1``) cuts before the grammar completes
is refused (``max_tokens_exceeded``, 413, naming the field), never returned.

Two execution modes compute different conditionals:

* **sequential** — each decision reads the earlier ones. The chosen *value* (JSON text) is
  written back as the assistant's reply and the next question follows as a new user turn, so
  prompt k+1 is prompt k plus a tail, byte for byte and token for token, and the prefix cache
  serves all of prompt k: one forward of the new tail per field.
* **batch** — every field reads only the context: the context is the shared prefix and each
  field is one branch of one packed forward (the System One fast path).

Layout of a sequential run (chat models; plain models use ``Answer:`` and blank lines)::

    system: <instructions + engine context>
    user:   <document>…</document>\\n\\n<question 1>      ← label of field 1 read here
    assistant: "travel"                                  ← value written back
    user:   <question 2>                                 ← label of field 2 read here
    …

Size: compilation (pure: values, fields, ``compile_schema``) and the runner (prompt growth,
open values, the two modes, the wire models) meet in ``SchemaField``; the pure half is the
natural first split if the module grows.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from onepass import prompt as P
from onepass.contract import DEFAULT_MODEL_ALIAS, ContractError, check_integer, finite_float
from onepass.limits import too_long, too_many, too_much_output
from onepass.readout import argmax_first, restricted_softmax

if TYPE_CHECKING:
    from onepass.engine import DecisionEngine

Mode = Literal["sequential", "batch"]
Kind = Literal["enum", "boolean", "score", "open"]
ValueType = Literal["string", "integer", "number"]

MODES = ("sequential", "batch")
MAX_FIELDS = 256
MAX_ENUM_VALUES = 255
MAX_SCORE_LEVELS = 11
DEFAULT_OPEN_MAX_TOKENS = 32
MAX_OPEN_TOKENS = 512
MAX_GENERATED_TOKENS = 2048
"""Open text one request may generate in all: each open field's bound (``max_open_tokens``,
or ``maxLength + 1``) is summed before anything runs."""
MAX_DECISION_SECONDS = 30.0
"""Wall time one ``/v1/decisions/schema`` request may compute, checked between fields and after
every generated token: past it the request is refused (413), it never holds a worker longer."""
ESCAPE_KEY = "x-open"
"""Probability key of the escape candidate of an open field."""
DEFAULT_ESCAPE_TEXT = "other"
"""Option text of an open enum's escape (``"x-open": "<text>"`` overrides it)."""
DEFAULT_FREE_TEXT = "write the answer"
"""Option text of the only candidate of an open string field without an enum."""
_MAX_REF_DEPTH = 32
MAX_COMPILE_STEPS = 200_000
"""Work one compilation may do: each schema node resolved is a step, each ``$ref`` merge as
many steps as the keys it copies, each declared value read a step. A ``$ref`` is expanded
(and paid for) wherever it is used, so a small schema whose references fan out exponentially
is refused, naming where the budget ran out, instead of being expanded."""
_UNSUPPORTED = ("allOf", "not", "if", "then", "else", "patternProperties")
STRING_CONSTRAINTS = ("pattern", "format", "minLength")
"""Keywords of an open string that cutting cannot guarantee: with any of them the open value
is generated under the grammar engine (``maxLength`` included), never checked afterwards."""
NUMBER_CONSTRAINTS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


# --------------------------------------------------------------------------- values


def value_text(value: Any) -> str:
    """A declared value as a string key: strings as-is, anything else as JSON text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _value_id(value: Any) -> tuple[str, str]:
    """Identity of a value that keeps ``True`` apart from ``1`` and ``"1"`` apart from ``1``."""
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, bool) or value is None:
        return ("c", json.dumps(value))
    if isinstance(value, (int, float)):
        number = finite_float(value)  # 1 and 1.0 are one value; past a double, the int itself
        return ("n", repr(value if number is None else number))
    return ("o", repr(value))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


MAX_DEPTH = 64


def _check_json(value: Any, where: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ContractError(where, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ContractError(where, "expected a finite number, got NaN or Infinity")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ContractError(where, "expected an object with string keys")
            _check_json(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]", depth + 1)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise ContractError(where, f"expected a JSON value, got {type(value).__name__}")


# --------------------------------------------------------------------------- compiled schema


@dataclass(frozen=True)
class SchemaField:
    """One decision: a leaf of the schema with its finite domain, in declared order.

    ``values`` are the declared values; an open field adds the escape candidate after them
    (its option text is ``escape_text``, its probability key :data:`ESCAPE_KEY`).
    """

    path: str
    keys: tuple[str, ...]
    kind: Kind
    question: Any
    values: tuple[Any, ...]
    descriptions: tuple[Any, ...]
    open: bool = False
    escape_text: str = DEFAULT_ESCAPE_TEXT
    max_length: int | None = None
    value_type: ValueType = "string"
    constraint: str | None = None
    """The JSON Schema (compact JSON text) its generated value is held to by the grammar
    engine while it is generated; None: an unconstrained string (stopped and cut, no grammar)."""

    @property
    def constrained(self) -> bool:
        """Its open branch is generated under a grammar (see :data:`constraint`)."""
        return self.constraint is not None

    @property
    def qtype(self) -> str:
        """The prompt question type it renders as (scores list ordered levels)."""
        return "score" if self.kind == "score" else "choice"

    @property
    def keys_text(self) -> tuple[str, ...]:
        """Probability keys, one per candidate (the escape last)."""
        keys = tuple(value_text(v) for v in self.values)
        return (*keys, ESCAPE_KEY) if self.open else keys

    @property
    def trivial(self) -> bool:
        """A single declared value and no escape: decided without the model."""
        return len(self.values) == 1 and not self.open

    def option_names(self) -> tuple[str, ...]:
        names = tuple(v if isinstance(v, str) and v else json.dumps(v) for v in self.values)
        return (*names, self.escape_text) if self.open else names

    def option_descriptions(self) -> tuple[Any, ...]:
        """For a score the level lines carry the value (the prompt prints no level names)."""
        if self.kind == "score":
            return tuple(
                n if d is None else f"{n}: {P.render_content(d)}"
                for n, d in zip(self.option_names(), self.descriptions, strict=True)
            )
        return (*self.descriptions, None) if self.open else self.descriptions

    def generation_bound(self, max_open_tokens: int) -> int:
        """Most tokens its open branch may generate (0 for a closed field): a token carries
        at least one character, so ``maxLength + 1`` tokens are enough for the body and the
        closing quote (a constrained value that still runs out is refused, not cut)."""
        if not self.open:
            return 0
        if self.max_length is None:
            return max_open_tokens
        return min(max_open_tokens, self.max_length + 1)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is in the field's domain: a declared value, or for an open field
        a value of its type within its bounds (length and ``pattern`` for strings, range for
        numbers; ``format`` and ``multipleOf`` are left to the grammar that enforced them)."""
        if _value_id(value) in {_value_id(v) for v in self.values}:
            return True
        return self.open and _violation(self, value) is None


def _violation(f: SchemaField, value: Any, pattern: bool = True) -> str | None:
    """Why ``value`` is not a value the open branch of ``f`` may produce (None: it may).

    Checked here: the JSON type, ``minLength``/``maxLength``, ``pattern`` (with Python's
    ``re``, skipped for syntax it does not read, and with ``pattern=False``: a backtracking
    match of a client's regex is no check to run inside a request) and the numeric bounds;
    the grammar engine enforced all of it, ``format`` and ``multipleOf`` too, while
    generating (and :func:`compile_constraints` checks declared values with it)."""
    spec = json.loads(f.constraint) if f.constraint else {}
    if f.value_type == "string":
        if not isinstance(value, str):
            return "is not a string"
        if f.max_length is not None and len(value) > f.max_length:
            return f"is longer than maxLength {f.max_length}"
        if len(value) < spec.get("minLength", 0):
            return f"is shorter than minLength {spec['minLength']}"
        if pattern and "pattern" in spec:
            try:
                if re.search(spec["pattern"], value) is None:
                    return f"does not match the pattern {spec['pattern']!r}"
            except re.error:  # a regex dialect Python does not read: the grammar enforced it
                pass
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is not {'an integer' if f.value_type == 'integer' else 'a number'}"
    if f.value_type == "integer" and not (isinstance(value, int) or value.is_integer()):
        return "is not an integer"
    bounds = (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
              ("exclusiveMinimum", lambda b: value > b), ("exclusiveMaximum", lambda b: value < b))
    for key, ok in bounds:
        if key in spec and not ok(spec[key]):
            return f"is outside {key} {spec[key]}"
    return None


@dataclass(frozen=True)
class CompiledSchema:
    """Fields in decision order, plus the object skeleton (nested objects, in order)."""

    fields: tuple[SchemaField, ...]
    slots: tuple[tuple[tuple[str, ...], SchemaField | None], ...]

    def assemble(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The typed object: nested objects in declared order, each leaf from ``values``."""
        out: dict[str, Any] = {}
        for keys, leaf in self.slots:
            parent = out
            for key in keys[:-1]:
                parent = parent[key]
            parent[keys[-1]] = {} if leaf is None else values[leaf.path]
        return out

    def validate(self, obj: Any) -> list[str]:
        """Every way ``obj`` misses the schema (empty when it is a valid decision)."""
        problems: list[str] = []
        for keys, leaf in self.slots:
            node, where = obj, []
            for key in keys:
                where.append(key)
                if not isinstance(node, dict) or key not in node:
                    problems.append(f"{'.'.join(where)}: missing")
                    break
                node = node[key]
            else:
                if leaf is None and not isinstance(node, dict):
                    problems.append(f"{'.'.join(keys)}: expected an object")
                elif leaf is not None and not leaf.contains(node):
                    problems.append(f"{leaf.path}: {node!r} is not a declared value")
        return problems


def _field_error(keys: Sequence[str], message: str,
                 kind: str = "invalid_request_error") -> ContractError:
    if not keys:
        return ContractError("schema", message, kind=kind)
    path = ".".join(keys)
    where = "schema" + "".join(f".properties.{k}" for k in keys)
    return ContractError(where, f"field '{path}': {message}", kind=kind)


def _types(node: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
    raw = node.get("type")
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items) or not items:
        raise _field_error(keys, "'type' must be a string or a non-empty array of strings")
    return tuple(items)


class _Budget:
    """Steps one compilation has left (:data:`MAX_COMPILE_STEPS`)."""

    def __init__(self, steps: int = MAX_COMPILE_STEPS):
        self.left = steps

    def spend(self, steps: int, keys: Sequence[str]) -> None:
        self.left -= steps
        if self.left < 0:
            raise _field_error(
                keys, f"the schema takes more than {MAX_COMPILE_STEPS} steps to compile (every "
                "'$ref' is expanded where it is used, so references that fan out multiply): "
                "declare fewer or less nested references"
            )


def _resolve(
    node: Any, root: Mapping[str, Any], keys: Sequence[str], budget: _Budget
) -> dict[str, Any]:
    """Follow local ``$ref`` pointers; keywords next to a ``$ref`` override the target's."""
    budget.spend(1, keys)
    for _ in range(_MAX_REF_DEPTH):
        if not isinstance(node, dict):
            raise _field_error(keys, f"expected a schema object, got {_json_type(node)}")
        ref = node.get("$ref")
        if ref is None:
            return node
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _field_error(keys, f"only local '$ref' pointers ('#/...') are supported: {ref!r}")
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise _field_error(keys, f"'$ref' {ref!r} points at nothing")
            target = target[part]
        if not isinstance(target, dict):
            raise _field_error(keys, f"'$ref' {ref!r} is not a schema object")
        budget.spend(len(target) + len(node), keys)
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    raise _field_error(keys, "'$ref' chain too deep (recursive schemas have no finite domain)")


def _scalar_values(raw: Any, keys: Sequence[str], what: str, budget: _Budget) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise _field_error(keys, f"'{what}' must be a non-empty array")
    budget.spend(len(raw), keys)
    for v in raw:
        if isinstance(v, (dict, list)):
            raise _field_error(keys, f"'{what}' values must be strings, numbers, booleans or null")
        if isinstance(v, float) and not math.isfinite(v):
            raise _field_error(keys, f"'{what}' values must be finite numbers")
    return list(raw)


def _check_distinct(values: Sequence[Any], keys: Sequence[str]) -> None:
    texts = [value_text(v) for v in values]
    if len(set(texts)) != len(texts):
        dup = next(t for t in texts if texts.count(t) > 1)
        raise _field_error(
            keys, f"declared values must be distinct as text; {dup!r} appears more than once"
        )
    if ESCAPE_KEY in texts:
        raise _field_error(keys, f"{ESCAPE_KEY!r} is reserved for the open branch")


def _check_types(values: Sequence[Any], types: Sequence[str], keys: Sequence[str]) -> None:
    if not types:
        return
    for v in values:
        t = _json_type(v)
        ok = t in types or (t == "integer" and "number" in types)
        if not ok:
            raise _field_error(keys, f"declared value {v!r} is {t}, not {' or '.join(types)}")


def _decimals(x: float | int) -> int:
    return max(0, -Decimal(repr(x)).as_tuple().exponent) if isinstance(x, float) else 0


def _range_levels(node: Mapping[str, Any], types: Sequence[str], keys: Sequence[str]) -> list:
    """Levels of a bounded number: multiples of ``multipleOf`` (or ``minimum + i·x-step``).

    The numbers are the client's: every quotient is checked finite and small before it is
    rounded or counted, so extreme bounds or steps are a refusal naming the field, never an
    overflow.
    """
    lo, hi = node.get("minimum"), node.get("maximum")
    step = node.get("multipleOf", node.get("x-step"))
    integer = "integer" in types and "number" not in types
    if step is None and integer:
        step = 1
    hint = (
        "a number needs 'minimum', 'maximum' and a step ('multipleOf' or 'x-step'; integers "
        f"default to 1) expanding to at most {MAX_SCORE_LEVELS} levels, or an 'enum', "
        "or 'x-score' levels"
    )
    nums = (lo, hi, step)
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in nums):
        if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
            hint += " (exclusive bounds are not supported: use minimum/maximum)"
        raise _field_error(keys, f"no finite domain: {hint}")
    if any(finite_float(x) is None for x in nums) or step <= 0 or hi < lo:
        raise _field_error(keys, "needs finite minimum <= maximum and a step greater than 0 "
                           "(numbers a double can hold)")
    eps = 1e-9
    try:  # integers stay exact (10**20 + 3 is not 10**20); a float quotient may reach inf
        if "multipleOf" in node:
            first, last = lo / step - eps, hi / step + eps
        else:
            first, last = 0.0, (hi - lo) / step
    except OverflowError:  # an integer quotient past a double
        first = last = math.inf
    span = last - first  # at least span - 1 levels: past MAX + 1, too many for sure
    if not (math.isfinite(first) and math.isfinite(span)):
        raise _field_error(keys, "the levels cannot be counted: the bounds divided by the step "
                           f"overflow a double; {hint}")
    if span > MAX_SCORE_LEVELS + 1:
        raise _field_error(keys, f"expands to more than {MAX_SCORE_LEVELS} levels: {hint}")
    if "multipleOf" in node:
        raw = [k * step for k in range(math.ceil(first), math.floor(last) + 1)]
    else:
        n = round(last) if abs(last - round(last)) < 1e-6 else math.floor(last)
        raw = [lo + i * step for i in range(n + 1)]
    if len(raw) > MAX_SCORE_LEVELS:
        raise _field_error(keys, f"expands to more than {MAX_SCORE_LEVELS} levels: {hint}")
    digits = max(_decimals(lo), _decimals(step), _decimals(hi))
    all_int = isinstance(lo, int) and isinstance(step, int)
    levels: list[Any] = []
    for x in raw:
        x = round(x, digits)
        if integer or all_int:
            if not float(x).is_integer():
                continue
            x = int(x)
        levels.append(x)
    if not levels:
        raise _field_error(keys, "the bounds and step admit no value")
    return levels


def _descriptions(node: Mapping[str, Any], count: int, keys: Sequence[str]) -> tuple[Any, ...]:
    raw = node.get("x-descriptions")
    if raw is None:
        return (None,) * count
    if not isinstance(raw, list) or len(raw) != count:
        raise _field_error(keys, f"'x-descriptions' must be an array of {count} descriptions")
    for d in raw:
        if d is not None and not isinstance(d, (str, dict, list)):
            raise _field_error(keys, "'x-descriptions' items must be strings, JSON or null")
    return tuple(raw)


def _question(node: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in ("x-question", "description", "title"):
        text = node.get(key)
        if text is None:
            continue
        if not isinstance(text, (str, dict, list)) or (isinstance(text, str) and not text.strip()):
            raise _field_error(keys, f"'{key}' must be non-empty text (the question asked)")
        return text  # JSON-checked with the whole schema
    return f"What is the value of '{'.'.join(keys)}'?"


def _leaf(
    node: dict[str, Any], root: Mapping[str, Any], keys: tuple[str, ...], budget: _Budget
) -> SchemaField:
    types = _types(node, keys)
    question = _question(node, keys)
    bad = next((k for k in _UNSUPPORTED if k in node), None)
    if bad:
        raise _field_error(keys, f"'{bad}' cannot be decided over a finite domain")
    if "array" in types or "items" in node:
        raise _field_error(keys, "arrays have no finite domain: use an enum or an object")
    open_flag = node.get("x-open", False)
    if not isinstance(open_flag, (bool, str)) or open_flag == "":
        raise _field_error(keys, "'x-open' must be true, false or the escape option's text")
    is_open = bool(open_flag)
    escape = open_flag if isinstance(open_flag, str) else DEFAULT_ESCAPE_TEXT

    score = node.get("x-score", False)
    kind: Kind
    if "anyOf" in node or "oneOf" in node:
        combo = "anyOf" if "anyOf" in node else "oneOf"
        branches = node[combo]
        if not isinstance(branches, list) or not branches:
            raise _field_error(keys, f"'{combo}' must be a non-empty array")
        values = []
        for branch in branches:
            b = _resolve(branch, root, keys, budget)
            bt = _types(b, keys)
            if "const" in b:
                values.append(b["const"])
            elif "enum" in b:
                values.extend(_scalar_values(b["enum"], keys, "enum", budget))
            elif bt and set(bt) <= {"boolean", "null"}:
                values.extend(([True, False] if "boolean" in bt else []) + (
                    [None] if "null" in bt else []))
            else:
                raise _field_error(
                    keys, f"every '{combo}' branch must be an enum, a const, boolean or null"
                )
        unique: dict[tuple[str, str], Any] = {}
        for v in values:  # the first of equal values wins, in one pass
            unique.setdefault(_value_id(v), v)
        values = list(unique.values())
        kind = "enum"
    elif "const" in node:
        values = _scalar_values([node["const"]], keys, "const", budget)
        kind = "enum"
    elif "enum" in node:
        values = _scalar_values(node["enum"], keys, "enum", budget)
        _check_types(values, types, keys)
        kind = "score" if score is True else "enum"
        if all(isinstance(v, bool) for v in values):
            kind = "boolean"
    elif isinstance(score, list):
        values = _scalar_values(score, keys, "x-score", budget)
        _check_types(values, types, keys)
        kind = "score"
    elif types and set(types) <= {"boolean", "null"}:
        values = ([True, False] if "boolean" in types else []) + (
            [None] if "null" in types else [])
        kind = "boolean" if "boolean" in types else "enum"
    elif types and set(types) <= {"number", "integer"} and is_open and score is False:
        values, kind = [], "open"  # generated under its bounds, never enumerated
        escape = open_flag if isinstance(open_flag, str) else DEFAULT_FREE_TEXT
    elif types and set(types) <= {"number", "integer"}:
        values = _range_levels(node, types, keys)
        kind = "score"
    elif is_open and (not types or set(types) <= {"string"}):
        values, kind = [], "open"
        escape = open_flag if isinstance(open_flag, str) else DEFAULT_FREE_TEXT
    elif "string" in types:
        raise _field_error(
            keys, "a free string has no finite domain: give an 'enum', or declare the field "
            "open with \"x-open\": true (free text only through that escape)"
        )
    else:
        shown = " or ".join(types) if types else "no 'type' and no 'enum'"
        raise _field_error(keys, f"no finite domain ({shown}): give an 'enum', 'const', "
                           "boolean, 'x-score' levels or a bounded number with a step")
    if score not in (False, True) and not isinstance(score, list):
        raise _field_error(keys, "'x-score' must be true (the enum is ordered) or a list of levels")
    numeric = bool(types) and set(types) <= {"number", "integer"}
    value_type: ValueType = (("number" if "number" in types else "integer") if numeric
                             else "string")
    if is_open and (kind in ("score", "boolean") or (types and "string" not in types
                                                     and not numeric)):
        raise _field_error(keys, "'x-open' applies to string and number fields (an enum, a "
                           "string, or a number or integer generated under its bounds)")
    max_length = node.get("maxLength")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0
    ):
        raise _field_error(keys, "'maxLength' must be a non-negative integer")
    constraint = _constraint(node, keys, value_type, max_length) if is_open else None
    limit = MAX_SCORE_LEVELS if kind == "score" else MAX_ENUM_VALUES
    if len(values) > limit:
        raise _field_error(keys, f"at most {limit} values are supported, got {len(values)}")
    _check_distinct(values, keys)
    if is_open and escape in {value_text(v) for v in values}:
        raise _field_error(keys, f"the escape text {escape!r} is also a declared value")
    leaf = SchemaField(
        path=".".join(keys),
        keys=keys,
        kind=kind,
        question=question,
        values=tuple(values),
        descriptions=_descriptions(node, len(values), keys) if values else (),
        open=is_open,
        escape_text=escape,
        max_length=max_length if is_open and value_type == "string" else None,
        value_type=value_type if is_open else "string",
        constraint=constraint,
    )
    if constraint is not None:  # enum and constraint together: every declared value obeys
        for v in values:  # (pattern and format: by the grammar, in compile_constraints)
            why = _violation(leaf, v, pattern=False)
            if why is not None:
                raise _field_error(keys, f"declared value {v!r} {why}: an open field's "
                                   "constraints hold for its declared values too")
    return leaf


def _constraint(node: Mapping[str, Any], keys: Sequence[str], value_type: ValueType,
                max_length: int | None) -> str | None:
    """The JSON Schema an open value is generated under (compact text), or None for a string
    the unconstrained branch serves exactly (no keyword, or ``maxLength`` alone: the text is
    stopped and cut there, which always satisfies it)."""
    if value_type == "string":
        spec: dict[str, Any] = {"type": "string"}
        for key in STRING_CONSTRAINTS:
            if key not in node:
                continue
            raw = node[key]
            if key == "minLength" and (isinstance(raw, bool) or not isinstance(raw, int)
                                       or raw < 0):
                raise _field_error(keys, "'minLength' must be a non-negative integer")
            if key != "minLength" and not isinstance(raw, str):
                raise _field_error(keys, f"'{key}' must be a string")
            spec[key] = raw
        if len(spec) == 1:
            return None
        if max_length is not None:
            spec["maxLength"] = max_length
    else:
        spec = {"type": value_type}
        for key in NUMBER_CONSTRAINTS:
            if key not in node:
                continue
            raw = node[key]
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (
                    finite_float(raw) is None):
                raise _field_error(keys, f"'{key}' must be a finite number (exclusive bounds "
                                   "are numbers, as in JSON Schema 2019-09 and later)")
            if key == "multipleOf" and raw <= 0:
                raise _field_error(keys, "'multipleOf' must be greater than 0")
            spec[key] = raw
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


def compile_schema(schema: Any) -> CompiledSchema:
    """Fields of an object schema in declared property order (nested objects flattened).

    Raises :class:`ContractError` naming the field when a field has no finite domain.
    """
    if isinstance(schema, CompiledSchema):
        return schema
    if not isinstance(schema, dict):
        raise ContractError("schema", f"expected a JSON Schema object, got {_json_type(schema)}")
    _check_json(schema, "schema")
    fields: list[SchemaField] = []
    slots: list[tuple[tuple[str, ...], SchemaField | None]] = []
    budget = _Budget()

    def walk(node: dict[str, Any], keys: tuple[str, ...]) -> None:
        if len(keys) > _MAX_REF_DEPTH:
            raise _field_error(keys, "objects nested too deep (a recursive '$ref'?)")
        props = node.get("properties")
        if not isinstance(props, dict):
            raise _field_error(
                keys, "expected an object schema with 'properties' (an object of field schemas)"
            )
        for name, sub in props.items():
            if not name or "." in name:
                raise _field_error((*keys, name), "property names must be non-empty, without '.'")
            child_keys = (*keys, name)
            child = _resolve(sub, schema, child_keys, budget)
            if "properties" in child or _types(child, child_keys) == ("object",):
                slots.append((child_keys, None))
                walk(child, child_keys)
            else:
                leaf = _leaf(child, schema, child_keys, budget)
                fields.append(leaf)
                slots.append((child_keys, leaf))
            if len(fields) > MAX_FIELDS:
                raise ContractError("schema", f"at most {MAX_FIELDS} fields are supported")

    root = _resolve(schema, schema, (), budget)
    walk(root, ())
    if not fields:
        raise ContractError("schema.properties", "expected at least one field to decide")
    return CompiledSchema(tuple(fields), tuple(slots))


def extend_schema(schema: Mapping[str, Any], learned: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` where each open field's generated value is a declared option.

    ``learned`` maps dotted paths to generated values (:attr:`SchemaDecision.learned`). Passing
    the result back makes the value one single-token label next time, the escape still open.
    """
    out = copy.deepcopy(dict(schema))
    budget = _Budget()
    for path, value in learned.items():
        node: dict[str, Any] = _resolve(out, out, (), budget)
        keys = path.split(".")
        for i, key in enumerate(keys):
            props = node.get("properties")
            if not isinstance(props, dict) or key not in props:
                raise ContractError("learned", f"{path!r} is not a field of the schema")
            props[key] = _resolve(props[key], out, keys[: i + 1], budget)  # never edit a $def
            node = props[key] = dict(props[key])
        enum = list(node.get("enum", []))
        if all(_value_id(v) != _value_id(value) for v in enum):
            enum.append(value)
        node["enum"] = enum
    return out


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class FieldDecision:
    """One field's outcome: the value, the distribution over its candidates, the label read.

    ``cached_tokens`` is how many prompt tokens the decision took from the prefix cache,
    ``prompt_tokens`` the length of the prompt it was read at, ``tokens`` that prompt's ids and
    ``candidates`` the label token ids read (kept for audits: tests recompute them naively).
    """

    path: str
    value: Any
    probabilities: dict[str, float]
    label: str | None
    cached_tokens: int = 0
    prompt_tokens: int = 0
    generated: bool = False
    tokens: tuple[int, ...] = field(default=(), repr=False, compare=False)
    candidates: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "value": self.value,
            "probabilities": dict(self.probabilities),
            "cached_tokens": self.cached_tokens,
        }
        if self.generated:
            out["generated"] = True
        return out


@dataclass
class SchemaDecision:
    """The typed object plus, per dotted field path, how it was decided."""

    model: str
    mode: Mode
    value: dict[str, Any]
    fields: dict[str, FieldDecision]
    usage: dict[str, int]
    seconds: float = 0.0

    @property
    def learned(self) -> dict[str, Any]:
        """Values produced by open branches, to pass back through :func:`extend_schema`."""
        return {p: f.value for p, f in self.fields.items() if f.generated}

    def to_dict(self) -> dict[str, Any]:
        """The HTTP/CLI response body."""
        return {
            "model": self.model,
            "mode": self.mode,
            "value": self.value,
            "fields": {p: f.to_dict() for p, f in self.fields.items()},
            "usage": dict(self.usage),
        }


# --------------------------------------------------------------------------- prompt growth

_TURN_BREAKS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def turn_break(engine: DecisionEngine) -> str:
    """Text between the assistant's written-back value and the next user question.

    Derived from the model's own chat template by rendering a two-turn conversation with
    marker strings; it must reproduce the one-turn prompt as a prefix. Without a template (or
    if it does not), a blank line continues the transcript.
    """
    if engine in _TURN_BREAKS:
        return _TURN_BREAKS[engine]
    from onepass.engine import decision_render  # (engine imports this module)

    fmt, backend = engine.format, engine.backend
    found = "\n\n"
    if getattr(backend, "chat_template", None) and fmt != P.PLAIN_FORMAT:
        s, u1, a1, u2 = (f"\x01ONEPASS_{m}\x01" for m in ("S", "U", "A", "V"))
        first = fmt.head + s + fmt.middle + u1 + fmt.tail + a1
        end = u2 + fmt.tail
        for messages in (
            [{"role": "system", "content": s}, {"role": "user", "content": u1}],
            [{"role": "user", "content": s + fmt.middle + u1}],
        ):
            messages += [{"role": "assistant", "content": a1}, {"role": "user", "content": u2}]
            try:
                text = decision_render(backend)(messages)
            except Exception:  # a template that refuses this shape: try the next one
                continue
            if text.startswith(first) and text.endswith(end) and len(text) >= len(first + end):
                found = text[len(first) : len(text) - len(end)]
                break
    _TURN_BREAKS[engine] = found
    return found


def _next_turn(engine: DecisionEngine, suffix: str) -> str:
    """The question block of ``suffix`` and what follows it, without what precedes it.

    ``render_suffix`` wraps the block (a separator from the document before it, the chat tail
    after it); in a new user turn the separator is dropped and everything else is kept, so the
    position still ends exactly where its labels were checked.
    """
    mark = "\x01ONEPASS_BLOCK\x01"
    lead, _ = P.render_suffix(engine.format, mark).split(mark)
    if not suffix.startswith(lead):
        raise RuntimeError("prompt.render_suffix no longer starts with a fixed separator")
    return suffix[len(lead):]


def record_lead(label: P.Label) -> str:
    """Whitespace the model puts before its answer here (`` A`` after ``Answer:``): the
    written-back value follows the same spacing, so it reads as the model's own reply."""
    return label.spelling[: len(label.spelling) - len(label.spelling.lstrip())]


def record_text(value: Any, specials: Sequence[str] = ()) -> str:
    """The value as written back into the prompt: JSON text, special tokens neutralised."""
    return P.neutralise(json.dumps(value, ensure_ascii=False, allow_nan=False), specials)


# --------------------------------------------------------------------------- open branch


def _string_end(text: str) -> int | None:
    """Index where a JSON string body ends (unescaped quote or raw control char), else None."""
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"' or ord(ch) < 0x20:
            return i
    return None


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def read_json_string(body: str, max_length: int | None = None) -> str:
    """Decode a generated JSON string body (possibly cut by the bound) into a valid string.

    A dangling or invalid escape is dropped, lone surrogates and a trailing partial character
    are removed, and the result is cut to ``max_length`` characters.
    """
    end = _string_end(body)
    body = body if end is None else body[:end]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and len(body) >= i + 6 and all(
            c in "0123456789abcdefABCDEF" for c in body[i + 2 : i + 6]
        ):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:  # invalid or cut-off escape: drop the backslash
            i += 1
    text = "".join(out)
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "ignore")
    text = "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF).rstrip("\ufffd")
    return text if max_length is None else text[:max_length]


def _generate_string(
    engine: DecisionEngine, tokens: list[int], lead: str, max_tokens: int,
    max_length: int | None, expired: Callable[[], bool],
) -> tuple[str, int, int, int]:
    """Open the record's string (after ``lead``) and generate to its closing quote, a bound,
    or ``expired()`` (checked after every token).

    Returns ``(value, prompt tokens, cached prompt tokens, generated tokens)``.
    """
    backend = engine.backend
    prompt = tokens + backend.encode(lead + '"', bos=False)

    def closed(ids: list[int]) -> bool:
        text = backend.decode(ids)
        return expired() or _string_end(text) is not None or (
            max_length is not None and len(read_json_string(text)) > max_length
        )

    ids, cached = engine.continuation(prompt, max_tokens, stop=closed)
    return read_json_string(backend.decode(ids), max_length), len(prompt), cached, len(ids)


def compile_constraints(engine: DecisionEngine, fields: Sequence[SchemaField]) -> dict[str, Any]:
    """The grammar of every constrained open field, by path, compiled for the engine's
    vocabulary before any model work (cached per vocabulary by the grammar module).

    A construct the grammar engine cannot enforce is a :class:`ContractError` naming the field
    and the keyword (an unknown ``format``, look-around in ``pattern``, ...), never loosened.
    """
    constrained = [f for f in fields if f.open and f.constrained]
    if not constrained:
        return {}
    from onepass.generate.grammar import compile_grammar, tokenizer_info

    info = tokenizer_info(engine.backend)
    out: dict[str, Any] = {}
    for f in constrained:
        spec = json.loads(f.constraint or "{}")
        try:
            grammar = compile_grammar(info, json_schema=spec, field=f.path)
        except ContractError as exc:
            raise _field_error(f.keys, f"{_culprit(info, spec)} cannot be enforced while "
                               f"generating: {exc.message}") from None
        for value in f.values:  # declared values obey the constraints too (linear: a DFA)
            if f.value_type == "integer" and isinstance(value, float):
                value = int(value)  # 1.0 is the integer 1 (the type check admitted it)
            if not _grammar_admits(grammar, value):
                raise _field_error(f.keys, f"declared value {value!r} does not satisfy the "
                                   f"field's constraints {f.constraint}")
        out[f.path] = grammar
    return out


def _grammar_admits(grammar: Any, value: Any) -> bool:
    """Whether ``value``'s JSON text is a complete sentence of ``grammar``."""
    from onepass.generate.grammar import GrammarError

    matcher = grammar.matcher()
    try:
        for token in grammar.info.token_ids(json.dumps(value, ensure_ascii=False)):
            matcher.accept(token)
    except GrammarError:
        return False
    return matcher.is_accepting()


def _culprit(info: Any, spec: Mapping[str, Any]) -> str:
    """The keyword of a refused constraint (each compiled alone), for the error message."""
    from onepass.generate.grammar import compile_grammar

    keys = [k for k in spec if k != "type"]
    for key in keys:
        try:
            compile_grammar(info, json_schema={"type": spec["type"], key: spec[key]})
        except ContractError:
            return f"'{key}': {json.dumps(spec[key], ensure_ascii=False)}"
    return "the combination of " + ", ".join(f"'{k}'" for k in keys)


def _generate_value(
    engine: DecisionEngine, f: SchemaField, grammar: Any, tokens: list[int], lead: str,
    max_tokens: int, expired: Callable[[], bool],
) -> tuple[Any, bool, int, int, int]:
    """Generate an open value under its grammar, greedily (the argmax of allowed tokens).

    A string's prompt ends with ``lead + '"'`` exactly as on the unconstrained branch (the
    matcher is advanced past that quote); a number's ends before ``lead``, which the grammar
    then requires, so the model spells `` 42`` its own way. Returns ``(value, complete,
    prompt tokens, cached prompt tokens, generated tokens)``; ``complete`` is False when the
    bound or ``expired()`` stopped it before the grammar was satisfied (value None).
    """
    from onepass.generate.grammar import compile_grammar

    backend = engine.backend
    info = grammar.info
    if f.value_type == "string":
        prompt = tokens + backend.encode(lead + '"', bos=False)
        matcher = grammar.matcher()
        for token in info.token_ids('"'):
            matcher.accept(token)
        opener = '"'
    else:
        prompt = list(tokens)
        if lead:  # the lead the record writes back (`` 42`` after ``Answer:``), then the value
            grammar = compile_grammar(
                info, grammar=f"start: {json.dumps(lead)} value\nvalue: %json {f.constraint}",
                field=f.path,
            )
        matcher = grammar.matcher()
        opener = ""
    ids, cached = engine.continuation(prompt, max_tokens, stop=lambda _ids: expired(),
                                      matcher=matcher)
    complete = matcher.done or (len(ids) < max_tokens and matcher.is_accepting()
                                and not expired())
    value = None
    if complete:
        value = json.loads(opener + bytes(info.engine.decode_bytes(ids)).decode("utf-8"))
        if f.value_type == "integer" and isinstance(value, float):
            value = int(value)
    return value, complete, len(prompt), cached, len(ids)


# --------------------------------------------------------------------------- deciding


def _choose(probabilities: Sequence[float], rng: random.Random | None) -> int:
    """Argmax (first wins ties), or a draw from the candidate distribution."""
    if rng is None:
        return argmax_first(probabilities)
    u, acc = rng.random(), 0.0
    for i, p in enumerate(probabilities):
        acc += p
        if u < acc:
            return i
    return max(i for i, p in enumerate(probabilities) if p > 0)


def _score_prompt(
    engine: DecisionEngine, tokens: list[int], candidates: list[int]
) -> tuple[list[float], int]:
    """Candidate logits at the end of ``tokens``, leaving ``tokens`` (with shared steps: all
    but the last) in the cache."""
    backend = engine.backend
    scorer = engine.scorer  # the server's: one more decision of the shared steps
    if scorer is None and engine.capabilities.steps:
        scorer = engine.generator.scheduler.score  # a library caller's: the same loop
    if scorer is not None:
        result = scorer(tokens[:-1], [tokens[-1:]], [candidates])
        return result.logits[0], result.cached_tokens
    if engine.capabilities.generates:  # llama.cpp, a remote engine: their own loop
        _, logits, cached = backend.generate(tokens, 0, candidates=candidates)
        return logits, cached
    # protocol-only backends: score the last token after the rest, then store the whole prompt
    result = backend.score(tokens[:-1], [tokens[-1:]], [candidates])
    backend.prefill(tokens)
    return result.logits[0], result.cached_tokens


def _check_length(engine: DecisionEngine, n: int) -> None:
    if n > engine.max_input_tokens:
        raise too_long("context", n, engine.max_input_tokens,
                       advice="shorten the context or the schema")


class _Run:
    """State of one decision run: readout options, the wall-time bound and the usage tally."""

    def __init__(self, engine: DecisionEngine, plan: DecisionPlan):
        self.engine = engine
        self.plan = plan
        self.rng = random.Random(plan.seed) if plan.sample else None
        self.started = time.monotonic()
        self.decided = 0
        self.input_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0

    def expired(self) -> bool:
        limit = self.plan.time_limit
        return limit is not None and time.monotonic() - self.started > limit

    def check_time(self) -> None:
        """Between fields (and after generated text): past the time limit, refuse."""
        if self.expired():
            raise ContractError(
                "schema",
                f"deciding ran past the time limit of {self.plan.time_limit:g} s per request "
                f"after {self.decided} of {len(self.plan.compiled.fields)} fields; nothing is "
                "returned: split the schema, use batch mode or lower max_open_tokens",
                kind="request_too_large",
            )

    def readout(self, f: SchemaField, logits: list[float]) -> tuple[list[float], int]:
        probs = restricted_softmax(logits, self.plan.temperature)
        return probs, _choose(probs, self.rng)

    def open_value(self, f: SchemaField, tokens: list[int], lead: str) -> Any:
        _check_length(self.engine, len(tokens) + 1)
        bound = f.generation_bound(self.plan.max_open_tokens)
        grammar = self.plan.grammars.get(f.path) if f.constrained else None
        if f.constrained and grammar is None:  # a plan made by hand: compile it now
            grammar = compile_constraints(self.engine, [f])[f.path]
        complete = True
        if grammar is None:
            value, n, cached, out = _generate_string(
                self.engine, tokens, lead, bound, f.max_length, self.expired,
            )
        else:
            value, complete, n, cached, out = _generate_value(
                self.engine, f, grammar, tokens, lead, bound, self.expired,
            )
        self.input_tokens += n
        self.cached_tokens += cached
        self.output_tokens += out
        self.check_time()
        if not complete:  # a cut value could break the constraint: refuse, never return it
            bound_by = f"max_open_tokens {self.plan.max_open_tokens}" + (
                f", maxLength {f.max_length} + 1" if f.max_length is not None else "")
            raise _field_error(
                f.keys, f"the generated value was not complete after {out} tokens (the bound: "
                f"{bound_by}); a cut value could break the field's constraints, so nothing is "
                "returned: raise max_open_tokens", kind="max_tokens_exceeded",
            )
        return value

    def decision(self, f: SchemaField, position: Any, probs: list[float], index: int,
                 tokens: list[int], cached: int) -> FieldDecision:
        generated = f.open and index == len(f.values)
        lead = record_lead(position.labels[index])
        value = self.open_value(f, tokens, lead) if generated else f.values[index]
        self.decided += 1
        return FieldDecision(
            f.path, value, dict(zip(f.keys_text, probs, strict=True)), position.labels[index].text,
            cached, len(tokens), generated, tuple(tokens),
            tuple(lb.token_id for lb in position.labels),
        )


def _trivial(f: SchemaField) -> FieldDecision:
    return FieldDecision(f.path, f.values[0], {value_text(f.values[0]): 1.0}, None)


def _position(engine: DecisionEngine, f: SchemaField, *, checked: bool = True) -> Any:
    """The field's question position; ``checked=False``: a draft (see ``engine.draft``)."""
    render = engine.position if checked else engine.draft
    try:
        return render(f.qtype, f.question, f.option_names(), f.option_descriptions())
    except P.LabelError as exc:  # more values than the tokenizer has single-token labels
        raise _field_error(f.keys, f"{exc}; declare fewer values") from None


def _sequential(run: _Run, compiled: CompiledSchema, prefix_text: str) -> list[FieldDecision]:
    engine = run.engine
    backend = engine.backend
    live = [f for f in compiled.fields if not f.trivial]
    drafts = [_position(engine, f, checked=False).suffix for f in live]
    engine.check_length(
        prefix_text,
        drafts[:1] + [turn_break(engine) + _next_turn(engine, d) for d in drafts[1:]],
        limit_field="context", joined=True,
    )
    text: str | None = None
    tokens: list[int] = []
    record = ""
    out = []
    for f in compiled.fields:
        if f.trivial:
            out.append(_trivial(f))
            continue
        run.check_time()
        position = _position(engine, f)
        if text is None:
            new_text = prefix_text + position.suffix
        else:
            new_text = text + record + turn_break(engine) + _next_turn(engine, position.suffix)
        full = backend.encode(new_text)
        if full[: len(tokens)] != tokens:  # the joint merged across the boundary: keep prompt k
            full = tokens + backend.encode(new_text[len(text or ""):], bos=False)
        _check_length(engine, len(full))
        candidates = [lb.token_id for lb in position.labels]
        if f.kind == "open":  # only the escape is declared: nothing to read
            logits, cached = [0.0], backend.prefill(full)
        else:
            logits, cached = _score_prompt(engine, full, candidates)
            run.output_tokens += 1
        run.input_tokens += len(full)
        run.cached_tokens += cached
        probs, index = run.readout(f, logits)
        decision = run.decision(f, position, probs, index, full, cached)
        out.append(decision)
        text, tokens = new_text, full
        record = record_lead(position.labels[index]) + record_text(decision.value,
                                                                   engine.specials)
    return out


def _batch(run: _Run, compiled: CompiledSchema, prefix_text: str) -> list[FieldDecision]:
    engine = run.engine
    live = [f for f in compiled.fields if not f.trivial]
    engine.check_length(
        prefix_text, [_position(engine, f, checked=False).suffix for f in live],
        limit_field="context",
    )
    positions = {f.path: _position(engine, f) for f in live}
    run.check_time()
    scored_fields = [f for f in live if f.kind != "open"]
    logits: dict[str, list[float]] = {}
    prompts: dict[str, list[int]] = {}
    cached = 0
    if scored_fields:
        scored = engine.score_positions(
            prefix_text, [positions[f.path] for f in scored_fields], limit_field="context"
        )
        for f, lg, suffix in zip(scored_fields, scored.logits, scored.suffixes, strict=True):
            logits[f.path], prompts[f.path] = lg, scored.prefix + suffix
        cached = scored.cached_tokens
        run.input_tokens += scored.input_tokens
        run.cached_tokens += cached
        run.output_tokens += len(scored_fields)
    out = []
    for f in compiled.fields:
        if f.trivial:
            out.append(_trivial(f))
            continue
        run.check_time()
        position = positions[f.path]
        tokens = prompts.get(f.path) or engine.backend.encode(prefix_text + position.suffix)
        probs, index = run.readout(f, logits.get(f.path, [0.0]))
        field_cached = cached if f.kind != "open" else 0
        out.append(run.decision(f, position, probs, index, tokens, field_cached))
    return out


@dataclass(frozen=True)
class DecisionPlan:
    """A validated decision request: options checked, schema compiled, bounds checked.

    Making one costs no model work (so the server makes it before queueing anything);
    :func:`run_plan` is the model work.
    """

    context: Any
    compiled: CompiledSchema
    mode: Mode
    temperature: float
    sample: bool
    seed: int | None
    max_open_tokens: int
    time_limit: float | None = None
    grammars: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Compiled grammars of the constrained open fields, by path (:func:`compile_constraints`)."""


def plan_decisions(
    engine: DecisionEngine,
    context: Any,
    schema: Mapping[str, Any] | CompiledSchema,
    *,
    mode: Mode = "sequential",
    temperature: float | None = None,
    sample: bool = False,
    seed: int | None = None,
    max_open_tokens: int = DEFAULT_OPEN_MAX_TOKENS,
    max_fields: int = MAX_FIELDS,
    time_limit: float | None = None,
) -> DecisionPlan:
    """Check every option, compile ``schema`` and check the work it asks for: at most
    ``max_fields`` fields and :data:`MAX_GENERATED_TOKENS` of open text (see
    :func:`decide_schema` for the options; ``time_limit`` bounds the run's wall time)."""
    if mode not in MODES:
        raise ContractError("mode", f"expected 'sequential' or 'batch', got {mode!r}")
    if context is None:
        raise ContractError("context", "expected a string or a JSON value, got null")
    _check_json(context, "context")
    if temperature is None:
        temperature = engine.temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ContractError("temperature", "expected a finite number greater than 0")
    temperature = finite_float(temperature)
    if temperature is None or temperature <= 0:
        raise ContractError("temperature", "expected a finite number greater than 0")
    if not isinstance(sample, bool):
        raise ContractError("sample", f"expected true or false, got {_json_type(sample)}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ContractError("seed", f"expected an integer or null, got {_json_type(seed)}")
    check_integer("max_open_tokens", max_open_tokens, 1, MAX_OPEN_TOKENS)
    compiled = compile_schema(schema)
    if len(compiled.fields) > max_fields:
        raise too_many("schema", len(compiled.fields), "fields", max_fields, "max_questions",
                       advice="split the schema")
    open_fields = [f for f in compiled.fields if f.open]
    if open_fields and not engine.capabilities.generation_steps:
        raise ContractError("schema", f"field {open_fields[0].path!r} is open (free text), which "
                            "needs a backend that generates text; this one only scores labels "
                            "(--backend torch or llamacpp generate)", kind="unsupported")
    generated = sum(f.generation_bound(max_open_tokens) for f in open_fields)
    if generated > MAX_GENERATED_TOKENS:
        raise too_much_output(
            "max_open_tokens", f"{len(open_fields)} open fields", generated,
            MAX_GENERATED_TOKENS,
            "lower max_open_tokens, set maxLength on the open fields, or split the schema")
    grammars = compile_constraints(engine, open_fields)
    return DecisionPlan(context, compiled, mode, temperature, sample, seed, max_open_tokens,
                        time_limit, grammars)


def run_plan(engine: DecisionEngine, plan: DecisionPlan) -> SchemaDecision:
    """Decide every field of a checked plan (the model work of :func:`decide_schema`)."""
    start = time.perf_counter()
    run = _Run(engine, plan)
    prefix_text = P.render_prefix(engine.format, plan.context, engine.context, engine.specials)
    decided = (_sequential if plan.mode == "sequential" else _batch)(run, plan.compiled,
                                                                     prefix_text)
    fields = {d.path: d for d in decided}
    stats = getattr(engine, "stats", None)
    if stats is not None:  # the same counters System One requests feed
        stats.requests += 1
        stats.questions += len(plan.compiled.fields)
        stats.input_tokens += run.input_tokens
        stats.cached_tokens += run.cached_tokens
    return SchemaDecision(
        model=engine.served_name,
        mode=plan.mode,
        value=plan.compiled.assemble({p: d.value for p, d in fields.items()}),
        fields=fields,
        usage={
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cached_tokens": run.cached_tokens,
        },
        seconds=time.perf_counter() - start,
    )


def decide_schema(
    engine: DecisionEngine,
    context: Any,
    schema: Mapping[str, Any] | CompiledSchema,
    *,
    mode: Mode = "sequential",
    temperature: float | None = None,
    sample: bool = False,
    seed: int | None = None,
    max_open_tokens: int = DEFAULT_OPEN_MAX_TOKENS,
    time_limit: float | None = None,
) -> SchemaDecision:
    """Decide every field of ``schema`` about ``context``; values are always declared values.

    ``mode="sequential"`` lets each field read the earlier answers (one growing, cached
    prompt); ``"batch"`` reads the context only (one packed forward). ``temperature`` acts on
    the candidate distribution only; ``sample=True`` draws from it (reproducibly with
    ``seed``), otherwise the argmax is taken. ``max_open_tokens`` bounds each open field's
    text, :data:`MAX_GENERATED_TOKENS` all of it; ``time_limit`` (seconds) bounds the run.
    """
    return run_plan(engine, plan_decisions(
        engine, context, schema, mode=mode, temperature=temperature, sample=sample, seed=seed,
        max_open_tokens=max_open_tokens, time_limit=time_limit,
    ))


# --------------------------------------------------------------------------- wire


def parse_decisions(
    engine: DecisionEngine, body: Any, *, max_fields: int = MAX_FIELDS
) -> DecisionPlan:
    """``POST /v1/decisions/schema``: validate the decoded body into a plan, with no model work.

    Client faults raise :class:`ContractError` naming the field (the server answers 4xx). The
    run is bounded by ``max_fields`` fields and :data:`MAX_DECISION_SECONDS` of wall time.
    """
    if not isinstance(body, dict):
        raise ContractError("body", f"expected a JSON object, got {_json_type(body)}")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ContractError("model", f"expected a non-empty string, got {_json_type(model)}")
    engine.check_model(model)
    if "context" not in body:
        raise ContractError("context", "field required: a string or any JSON value")
    if "schema" not in body:
        raise ContractError("schema", "field required: an object JSON Schema with 'properties'")
    if "mode" not in body:
        raise ContractError("mode", "field required: 'sequential' or 'batch'")
    return plan_decisions(
        engine,
        body["context"],
        body["schema"],
        mode=body["mode"],
        temperature=body.get("temperature"),
        sample=body.get("sample", False),
        seed=body.get("seed"),
        max_open_tokens=body.get("max_open_tokens", DEFAULT_OPEN_MAX_TOKENS),
        max_fields=max_fields,
        time_limit=MAX_DECISION_SECONDS,
    )


class DecisionsRequestModel(BaseModel):
    """``POST /v1/decisions/schema`` body, for the OpenAPI document (validation:
    parse_decisions)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    model: str | None = Field(default=None, examples=[DEFAULT_MODEL_ALIAS])
    context: JsonValue = Field(description="The document the decisions are about: text or JSON")
    schema_: dict[str, JsonValue] = Field(
        alias="schema",
        description=(
            "An object JSON Schema. Fields are decided in declared property order; each needs "
            "a finite domain: enum/const (strings, numbers, null), boolean, x-score levels, a "
            "number with minimum/maximum/multipleOf (at most 11 levels) or a nested object. "
            "description or x-question is the question; x-open: true adds an escape value "
            "filled by generated text (bounded by maxLength; pattern, format and minLength are "
            "enforced while generating) or, on an integer/number, a generated number within "
            "its minimum/maximum/exclusiveMinimum/exclusiveMaximum/multipleOf."
        ),
        examples=[{"type": "object", "properties": {
            "category": {"enum": ["meal", "travel", "equipment"]},
            "refundable": {"type": "boolean", "description": "Is the expense refundable?"},
        }}],
    )
    mode: Mode = Field(description="sequential: each field reads the earlier answers; "
                                   "batch: every field reads only the context")
    temperature: float | None = Field(default=None, gt=0)
    sample: bool = False
    seed: int | None = None
    max_open_tokens: int = Field(default=DEFAULT_OPEN_MAX_TOKENS, ge=1, le=MAX_OPEN_TOKENS)


class FieldDecisionModel(BaseModel):
    value: JsonValue
    probabilities: dict[str, float] = Field(
        description=f"Per declared value (as a string; the open escape is {ESCAPE_KEY!r})"
    )
    cached_tokens: int
    generated: bool | None = Field(default=None, description="true when the open branch wrote it")


class DecisionsUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cached_tokens: int


class DecisionsResponseModel(BaseModel):
    model: str
    mode: Mode
    value: dict[str, JsonValue]
    fields: dict[str, FieldDecisionModel]
    usage: DecisionsUsage
