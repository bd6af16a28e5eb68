"""What a compiled schema is: declared values and their identity, :class:`SchemaField` (one
decision over a finite domain, in declared order) and :class:`CompiledSchema` (the fields plus the
object skeleton they assemble into).

This is where compilation (:mod:`onepass.schema.compile`) and the runner
(:mod:`onepass.schema.decide`) meet: the one builds these, the other reads them. Pure: no torch,
no engine.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from onepass import prompt as P
from onepass.contract import ContractError, finite_float

Kind = Literal["enum", "boolean", "score", "open"]
ValueType = Literal["string", "integer", "number"]

ESCAPE_KEY = "x-open"
"""Probability key of the escape candidate of an open field."""
DEFAULT_ESCAPE_TEXT = "other"
"""Option text of an open enum's escape (``"x-open": "<text>"`` overrides it)."""


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
