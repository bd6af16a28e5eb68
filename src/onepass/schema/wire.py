"""``POST /v1/decisions/schema`` on the wire: :func:`parse_decisions` turns a decoded body into a
plan (client faults as :class:`ContractError` naming the field, the per-request wall-time bound
:data:`MAX_DECISION_SECONDS`), and the pydantic models describe the same body and its answer for
the OpenAPI document (they document; :func:`parse_decisions` validates).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from onepass.contract import DEFAULT_MODEL_ALIAS, ContractError
from onepass.schema.compile import MAX_FIELDS
from onepass.schema.decide import (
    DEFAULT_OPEN_MAX_TOKENS,
    MAX_OPEN_TOKENS,
    DecisionPlan,
    Mode,
    plan_decisions,
)
from onepass.schema.fields import ESCAPE_KEY, _json_type

if TYPE_CHECKING:
    from onepass.engine import DecisionEngine

MAX_DECISION_SECONDS = 30.0
"""Wall time one ``/v1/decisions/schema`` request may compute, checked between fields and after
every generated token: past it the request is refused (413), it never holds a worker longer."""


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
