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

Size: a module per job, every name re-exported here (``from onepass.schema import X``). Pure, no
torch and no engine: :mod:`~onepass.schema.fields` (declared values, ``SchemaField``,
``CompiledSchema``: where compilation and the runner meet) and :mod:`~onepass.schema.compile`
(``compile_schema``, ``extend_schema``). The runner: :mod:`~onepass.schema.decide` (results,
prompt growth, the two modes, ``plan_decisions``/``run_plan``/``decide_schema``) and
:mod:`~onepass.schema.open_branch` (open values: free text, or a value under its grammar).
:mod:`~onepass.schema.wire`: ``POST /v1/decisions/schema`` (``parse_decisions`` and the pydantic
models).
"""

from __future__ import annotations

from onepass.schema.compile import (
    DEFAULT_FREE_TEXT,
    MAX_COMPILE_STEPS,
    MAX_ENUM_VALUES,
    MAX_FIELDS,
    MAX_SCORE_LEVELS,
    NUMBER_CONSTRAINTS,
    STRING_CONSTRAINTS,
    compile_schema,
    extend_schema,
)
from onepass.schema.decide import (
    DEFAULT_OPEN_MAX_TOKENS,
    MAX_GENERATED_TOKENS,
    MAX_OPEN_TOKENS,
    MODES,
    DecisionPlan,
    FieldDecision,
    Mode,
    SchemaDecision,
    _choose,
    decide_schema,
    plan_decisions,
    record_lead,
    record_text,
    run_plan,
    turn_break,
)
from onepass.schema.fields import (
    DEFAULT_ESCAPE_TEXT,
    ESCAPE_KEY,
    MAX_DEPTH,
    CompiledSchema,
    Kind,
    SchemaField,
    ValueType,
    _value_id,
    value_text,
)
from onepass.schema.open_branch import _string_end, compile_constraints, read_json_string
from onepass.schema.wire import (
    MAX_DECISION_SECONDS,
    DecisionsRequestModel,
    DecisionsResponseModel,
    DecisionsUsage,
    FieldDecisionModel,
    parse_decisions,
)

__all__ = [
    # fields
    "DEFAULT_ESCAPE_TEXT",
    "ESCAPE_KEY",
    "MAX_DEPTH",
    "CompiledSchema",
    "Kind",
    "SchemaField",
    "ValueType",
    "value_text",
    "_value_id",
    # compile
    "DEFAULT_FREE_TEXT",
    "MAX_COMPILE_STEPS",
    "MAX_ENUM_VALUES",
    "MAX_FIELDS",
    "MAX_SCORE_LEVELS",
    "NUMBER_CONSTRAINTS",
    "STRING_CONSTRAINTS",
    "compile_schema",
    "extend_schema",
    # decide
    "DEFAULT_OPEN_MAX_TOKENS",
    "MAX_GENERATED_TOKENS",
    "MAX_OPEN_TOKENS",
    "MODES",
    "DecisionPlan",
    "FieldDecision",
    "Mode",
    "SchemaDecision",
    "decide_schema",
    "plan_decisions",
    "record_lead",
    "record_text",
    "run_plan",
    "turn_break",
    "_choose",
    # open_branch
    "compile_constraints",
    "read_json_string",
    "_string_end",
    # wire
    "MAX_DECISION_SECONDS",
    "DecisionsRequestModel",
    "DecisionsResponseModel",
    "DecisionsUsage",
    "FieldDecisionModel",
    "parse_decisions",
]
