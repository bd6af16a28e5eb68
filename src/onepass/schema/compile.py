"""JSON Schema → :class:`~onepass.schema.fields.CompiledSchema`: :func:`compile_schema`
resolves local ``$ref`` pointers under a step budget, flattens nested objects in declared order
and gives every leaf a finite domain (or refuses it, naming the field and why);
:func:`extend_schema` makes learned open values declared options.

Pure (no torch, no engine): a schema is checked before any model work, and the rules of what a
field may declare live in one place.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from onepass.contract import ContractError, finite_float
from onepass.schema.fields import (
    DEFAULT_ESCAPE_TEXT,
    ESCAPE_KEY,
    CompiledSchema,
    Kind,
    SchemaField,
    ValueType,
    _check_json,
    _field_error,
    _json_type,
    _value_id,
    _violation,
    value_text,
)

MAX_FIELDS = 256
MAX_ENUM_VALUES = 255
MAX_SCORE_LEVELS = 11
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
