"""The System One wire contract: request parsing, validation and response shapes.

Pure: imports no torch and no web framework. Every rule here is shared by the library, the CLI
and the HTTP server, so a request that one surface accepts, every surface accepts.

Validation errors name the field (``questions.urgency.criteria``) and what was expected; the
server turns them into 400/422 responses, the CLI into per-line error records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue

MAX_CHOICE_OPTIONS = 255
MAX_INSTRUCTIONS_CHARS = 64 * 1024
MAX_CACHE_SALT_CHARS = 1024
MAX_TEMPLATE_KWARGS = 32
MAX_TEMPLATE_KEY_CHARS = 64
MAX_TEMPLATE_VALUE_CHARS = 1024
THINKING_KEYS = ("enable_thinking", "thinking")
"""chat_template_kwargs keys that turn a template's reasoning on: a decision reads the reply's
first token, so thinking must stay off."""
RESERVED_TEMPLATE_KEYS = frozenset({
    "chat_template", "messages", "conversation", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})
"""Names the template renderer itself takes (a client's own ``chat_template`` would run its
Jinja on the server; ``messages`` would replace the prompt): never template variables."""
Scalar = str | int | float | bool | None
MAX_SCORE_LEVELS = 10
DEFAULT_MODEL_ALIAS = "jev-latest"
TYPED_LM_ALIAS = "typed-lm"  # the name typed-lm's own server answers to (its docs' requests)
NOUL_LABEL_SETS = ({"yes", "no"}, {"true", "false"})

QuestionType = Literal["noul", "choice", "score"]
DebiasMode = Literal["none", "name-order", "rotations", "content-free",
                     "name-order+content-free", "rotations+content-free"]
DEBIAS_MODES: tuple[str, ...] = get_args(DebiasMode)
"""``debias`` (an onepass extension field of the request): ``rotations`` reads every cyclic
rotation of each question's options in the same forward and combines them, so the answer does
not depend on the order the options were declared in; ``content-free`` also reads each question
about a blank document and divides that prior out (contextual calibration); ``name-order``
reads a choice's options sorted by name (one reading, order-invariant); absent: the server's
default (:mod:`onepass.option_order`)."""


class ContractError(ValueError):
    """A request that breaks the contract: ``field`` is the dotted path, ``message`` says why."""

    def __init__(self, field: str, message: str, *, kind: str = "invalid_request_error"):
        self.field = field
        self.message = message
        self.kind = kind
        super().__init__(f"{field}: {message}" if field else message)

    def __reduce__(self) -> tuple:
        """Pickled whole (a worker process hands it back as raised): its own fields, not
        ``args``."""
        return _contract_error, (self.field, self.message, self.kind)


def _contract_error(field: str, message: str, kind: str) -> ContractError:
    return ContractError(field, message, kind=kind)


# --------------------------------------------------------------------------- parsed request


@dataclass(frozen=True)
class Question:
    """One validated question. ``options`` are the answer names in declared order.

    For a noul the options are always ``("yes", "no")`` (or ``("true", "false")`` when the
    client named them so); ``descriptions`` holds the client's text for each option, or None.
    """

    name: str
    type: QuestionType
    instructions: JsonValue
    options: tuple[str, ...]
    descriptions: tuple[JsonValue, ...]

    @property
    def is_trivial(self) -> bool:
        """A 1-option choice or 1-level score answers without running the model."""
        return self.type != "noul" and len(self.options) == 1


@dataclass(frozen=True)
class DecisionRequest:
    model: str | None
    state: JsonValue
    questions: tuple[Question, ...]
    temperature: float | None = None
    debias: str | None = None  # None: the engine's default
    # the prefix-cache partition: OpenAI Decisions' prompt_cache_key, System One's cache_salt
    cache_namespace: str | None = None
    # vLLM's request fields: a preamble ahead of the questions (in the system turn, so in the
    # cached prefix), keyword arguments for the chat template, per-answer diagnostics
    instructions: str | None = None
    chat_template_kwargs: tuple[tuple[str, Scalar], ...] = ()
    diagnostics: bool = False


def finite_float(value: int | float) -> float | None:
    """A client's number as a finite float, or None: JSON integers can be far past a double
    (``float(10**400)`` overflows), so no arithmetic on them may assume one."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_integer(field: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an integer from ``low`` to ``high`` (None: no upper bound), or a 400 that
    names ``field``, in one wording for every route: a float or a bool is not an integer."""
    want = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        got = repr(value) if isinstance(value, float) else _describe(value)
        raise ContractError(field, f"expected {want}, got {got}")
    if value < low or (high is not None and value > high):
        raise ContractError(field, f"expected {want}, got {value}")
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_content(value: Any) -> bool:
    """Instructions, descriptions and levels may be a string or any JSON object/array."""
    return isinstance(value, (str, dict, list))


def _check_json(value: Any, where: str) -> None:
    """Reject values JSON cannot carry (NaN/Infinity floats, non-string keys)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ContractError(where, "expected a finite number, got NaN or Infinity")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ContractError(where, "expected an object with string keys")
            _check_json(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")


def _parse_question(name: str, raw: Any) -> Question:
    where = f"questions.{name}"
    if not isinstance(raw, dict):
        raise ContractError(where, f"expected a question object, got {_describe(raw)}")
    unknown = sorted(set(raw) - {"type", "instructions", "criteria"})
    if unknown:
        raise ContractError(
            f"{where}.{unknown[0]}",
            "unknown field; a question has only 'type', 'instructions' and 'criteria'",
        )
    qtype = raw.get("type")
    if qtype == "box":
        raise ContractError(
            f"{where}.type",
            "'box' questions need a vision-language model; this server serves text-only models",
            kind="unsupported_question_type",
        )
    if qtype not in ("noul", "choice", "score"):
        got = repr(qtype) if isinstance(qtype, str) else _describe(qtype)
        raise ContractError(f"{where}.type", f"expected 'noul', 'choice' or 'score', got {got}")
    instructions = raw.get("instructions")
    if instructions is not None and not _is_content(instructions):
        raise ContractError(
            f"{where}.instructions",
            f"expected a string or a JSON object/array, got {_describe(instructions)}",
        )
    _check_json(instructions, f"{where}.instructions")
    criteria = raw.get("criteria")
    crit_where = f"{where}.criteria"

    if qtype == "noul":
        options: tuple[str, ...] = ("yes", "no")
        descriptions: tuple[Any, ...] = (None, None)
        if criteria is not None:
            if not isinstance(criteria, dict):
                raise ContractError(
                    crit_where,
                    f"expected an object with keys 'yes'/'no' or 'true'/'false', "
                    f"got {_describe(criteria)}",
                )
            keys = set(criteria)
            label_set = next((s for s in NOUL_LABEL_SETS if keys <= s), None)
            if label_set is None or not keys:
                raise ContractError(
                    crit_where,
                    "expected keys 'yes'/'no' or 'true'/'false' (not mixed), "
                    f"got {sorted(keys)}",
                )
            options = ("yes", "no") if label_set == {"yes", "no"} else ("true", "false")
            for key, value in criteria.items():
                if value is not None and not _is_content(value):
                    raise ContractError(
                        f"{crit_where}.{key}",
                        f"expected a string, a JSON object/array or null, got {_describe(value)}",
                    )
                _check_json(value, f"{crit_where}.{key}")
            descriptions = tuple(criteria.get(o) for o in options)
        if instructions is None and all(d is None for d in descriptions):
            raise ContractError(
                where, "a noul question needs 'instructions' or at least one non-null criterion"
            )
        return Question(name, "noul", instructions, options, descriptions)

    if instructions is None:
        raise ContractError(f"{where}.instructions", f"a {qtype} question needs 'instructions'")

    if qtype == "choice":
        if not isinstance(criteria, dict):
            raise ContractError(
                crit_where,
                "expected an object mapping each option to a description or null, got "
                f"{_describe(criteria) if criteria is not None else 'nothing'}",
            )
        if not 1 <= len(criteria) <= MAX_CHOICE_OPTIONS:
            raise ContractError(
                crit_where,
                f"expected 1 to {MAX_CHOICE_OPTIONS} options, got {len(criteria)}",
            )
        for key, value in criteria.items():
            if not key.strip():
                raise ContractError(crit_where, "option names must be non-empty strings")
            if value is not None and not _is_content(value):
                raise ContractError(
                    f"{crit_where}.{key}",
                    f"expected a string, a JSON object/array or null, got {_describe(value)}",
                )
            _check_json(value, f"{crit_where}.{key}")
        return Question(
            name, "choice", instructions, tuple(criteria), tuple(criteria.values())
        )

    # score
    if not isinstance(criteria, list):
        raise ContractError(
            crit_where,
            "expected an array of 1 to 10 ordered level names, got "
            f"{_describe(criteria) if criteria is not None else 'nothing'}",
        )
    if not 1 <= len(criteria) <= MAX_SCORE_LEVELS:
        raise ContractError(
            crit_where, f"expected 1 to {MAX_SCORE_LEVELS} levels, got {len(criteria)}"
        )
    levels = []
    for i, level in enumerate(criteria):
        if level is None:
            raise ContractError(f"{crit_where}[{i}]", "expected a level name, got null")
        if isinstance(level, (bool, int, float)) and not isinstance(level, bool):
            _check_json(level, f"{crit_where}[{i}]")
            level = str(level)  # the legend must carry str/object/array: stringify scalars
        elif isinstance(level, bool):
            level = "true" if level else "false"
        _check_json(level, f"{crit_where}[{i}]")
        levels.append(level)
    return Question(
        name,
        "score",
        instructions,
        tuple(str(i) for i in range(len(levels))),
        tuple(levels),
    )


def parse_request(raw: Any) -> DecisionRequest:
    """Validate a decoded JSON body against the contract. Unknown top-level keys are ignored."""
    if not isinstance(raw, dict):
        raise ContractError("body", f"expected a JSON object, got {_describe(raw)}")
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise ContractError("model", f"expected a non-empty string, got {_describe(model)}")
    if isinstance(model, str) and not model.strip():
        raise ContractError("model", "expected a non-empty string, got an empty string")
    if "state" in raw:
        state = raw["state"]
    elif "document" in raw:  # hosted Jev accepts `document` as another name for `state`
        state = raw["document"]
    else:
        raise ContractError("state", "field required: a string or any JSON value")
    if state is None:
        raise ContractError("state", "expected a string or a JSON value, got null")
    _check_json(state, "state")
    if "assets" in raw and raw["assets"]:
        raise ContractError(
            "assets",
            "image assets need a vision-language model; this server serves text-only models",
            kind="unsupported_asset",
        )
    questions = raw.get("questions")
    if not isinstance(questions, dict):
        raise ContractError(
            "questions",
            "expected a non-empty object mapping names to questions, got "
            f"{_describe(questions) if 'questions' in raw else 'nothing'}",
        )
    if not questions:
        raise ContractError("questions", "expected at least one question, got an empty object")
    parsed = []
    for name, q in questions.items():
        if not name:
            raise ContractError("questions", "question names must be non-empty strings")
        parsed.append(_parse_question(name, q))
    temperature = raw.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ContractError(
                "temperature", f"expected a positive number, got {_describe(temperature)}"
            )
        temperature = finite_float(temperature)
        if temperature is None or temperature <= 0:
            raise ContractError("temperature", "expected a finite number greater than 0")
    debias = raw.get("debias")
    if debias is not None and debias not in DEBIAS_MODES:
        got = repr(debias) if isinstance(debias, str) else _describe(debias)
        raise ContractError("debias", f"expected one of {', '.join(DEBIAS_MODES)}, got {got}")
    instructions = _bounded_string(raw.get("instructions"), "instructions",
                                   MAX_INSTRUCTIONS_CHARS)
    salt = _bounded_string(raw.get("cache_salt"), "cache_salt", MAX_CACHE_SALT_CHARS)
    if salt is not None and not salt:
        raise ContractError("cache_salt", "expected a non-empty string, got an empty string")
    diagnostics = raw.get("diagnostics", False)
    if diagnostics is None:
        diagnostics = False
    if not isinstance(diagnostics, bool):
        raise ContractError("diagnostics", f"expected a boolean, got {_describe(diagnostics)}")
    return DecisionRequest(
        model, state, tuple(parsed), temperature, debias, cache_namespace=salt,
        instructions=instructions if instructions and instructions.strip() else None,
        chat_template_kwargs=parse_template_kwargs(raw.get("chat_template_kwargs")),
        diagnostics=diagnostics,
    )


def _bounded_string(value: Any, field: str, limit: int) -> str | None:
    """An optional string of at most ``limit`` characters (None when absent or null)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ContractError(field, f"expected a string, got {_describe(value)}")
    if len(value) > limit:
        raise ContractError(field, f"expected at most {limit} characters, got {len(value)}")
    return value


def parse_template_kwargs(value: Any, *, decision: bool = True
                          ) -> tuple[tuple[str, Scalar], ...]:
    """``chat_template_kwargs``: an object of JSON scalars, bounded, with thinking off for a
    ``decision`` (it reads the first token of the reply, which a thinking template spends on
    reasoning; generation may think). Returned as sorted pairs: one request's kwargs, one
    hashable key."""
    field = "chat_template_kwargs"
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ContractError(field, f"expected an object of scalar values, got {_describe(value)}")
    if len(value) > MAX_TEMPLATE_KWARGS:
        raise ContractError(field, f"expected at most {MAX_TEMPLATE_KWARGS} keys, "
                                   f"got {len(value)}")
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_TEMPLATE_KEY_CHARS:
            raise ContractError(field, f"keys must be 1 to {MAX_TEMPLATE_KEY_CHARS} characters")
        where = f"{field}.{key}"
        if key in RESERVED_TEMPLATE_KEYS:
            raise ContractError(where, "reserved: the server renders the prompt itself; "
                                       "only template variables can be set")
        if item is not None and not isinstance(item, (str, int, float, bool)):
            raise ContractError(where, f"expected a string, number, boolean or null, got "
                                       f"{_describe(item)} (nested values are not accepted)")
        if isinstance(item, str) and len(item) > MAX_TEMPLATE_VALUE_CHARS:
            raise ContractError(where, f"expected at most {MAX_TEMPLATE_VALUE_CHARS} "
                                       f"characters, got {len(item)}")
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**53:
            raise ContractError(where, "expected an integer within +-2**53")
        _check_json(item, where)
        if decision and key in THINKING_KEYS and item not in (None, False):
            raise ContractError(where, "decisions read the first token of the reply, so "
                                       "thinking must be off: send false or leave it out")
        pairs.append((key, item))
    return tuple(sorted(pairs))


# --------------------------------------------------------------------------- model aliases


def resolves_to(requested: str | None, served_name: str) -> bool:
    """`jev-latest`, any `jev-*`, `typed-lm` (a typed-lm client's name for its one model)
    and the served name all name the loaded model."""
    if requested is None:
        return True
    name = requested.strip()
    return name in (served_name, DEFAULT_MODEL_ALIAS, TYPED_LM_ALIAS) or name.startswith("jev-")


# --------------------------------------------------------------------------- wire schemas
# Pydantic models used for the OpenAPI document and for typed access in Python. The request
# models describe exactly what parse_request accepts.

Content = str | dict[str, JsonValue] | list[JsonValue]


class NoulQuestionModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["noul"]
    instructions: Content | None = None
    criteria: dict[str, Content | None] | None = Field(
        default=None, description="Optional {'yes','no'} or {'true','false'} descriptions"
    )


class ChoiceQuestionModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["choice"]
    instructions: Content
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=MAX_CHOICE_OPTIONS)


class ScoreQuestionModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["score"]
    instructions: Content
    criteria: list[Content] = Field(min_length=1, max_length=MAX_SCORE_LEVELS)


QuestionModel = NoulQuestionModel | ChoiceQuestionModel | ScoreQuestionModel


class SystemOneRequestModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, examples=[DEFAULT_MODEL_ALIAS])
    state: JsonValue
    questions: dict[str, QuestionModel] = Field(min_length=1)
    temperature: float | None = Field(default=None, gt=0)
    instructions: str | None = Field(
        default=None, max_length=MAX_INSTRUCTIONS_CHARS,
        description="Context ahead of the questions, rendered in the system turn after the "
        "server's own instructions and context (part of the cached prefix)")
    chat_template_kwargs: dict[str, str | int | float | bool | None] | None = Field(
        default=None, max_length=MAX_TEMPLATE_KWARGS,
        description="Keyword arguments for the model's chat template (JSON scalars only); "
        "'enable_thinking': true is refused: a decision reads the reply's first token")
    cache_salt: str | None = Field(
        default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS,
        description="Prefix-cache isolation: requests with different salts (or one with a "
        "salt and one without) never share cached prefixes")
    diagnostics: bool | None = Field(
        default=None,
        description="true: each answer read from the model carries 'diagnostics' "
        "(label_mass: the probability the model put on the option labels over its whole "
        "vocabulary; argmax_is_label: its most likely token is one of the labels); costs "
        "one full-vocabulary projection per question")
    debias: DebiasMode | None = Field(
        default=None,
        description="onepass extension: 'name-order' reads a choice's options sorted by name "
        "(any declared order reads the same prompt: order-invariant at no cost); "
        "'rotations' scores every cyclic rotation of each "
        "question's options in the same forward and averages them back in declared order "
        "(order-invariant answers, more input tokens); 'content-free' divides out the "
        "answer the model gives about a blank document (its prior for the question); "
        "'none' reads the declared order; absent: the server's default ('name-order', or "
        "'none' for weights trained in the declared order)",
    )


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0


ABSTAINED = Field(
    default=None,
    description="onepass extension, only when the server runs with --abstain-below: true when "
    "the answer's top probability is under the threshold (route it to a person); clients that "
    "do not know the field ignore it",
)


class Diagnostics(BaseModel):
    label_mass: float = Field(description="Total probability of the option labels over the "
                              "whole vocabulary at the answer position (declared order)")
    argmax_is_label: bool = Field(description="The vocabulary's most likely token there is "
                                  "one of the labels")


DIAGNOSTICS = Field(default=None, description="Only when the request asked for "
                    "'diagnostics' and the answer was read from the model")


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: float
    abstained: bool | None = ABSTAINED
    diagnostics: Diagnostics | None = DIAGNOSTICS


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    probabilities: dict[str, float]
    confidence: float
    abstained: bool | None = ABSTAINED
    diagnostics: Diagnostics | None = DIAGNOSTICS


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float
    legend: dict[str, Content]
    probabilities: dict[str, float]
    confidence: float
    abstained: bool | None = ABSTAINED
    diagnostics: Diagnostics | None = DIAGNOSTICS


class SystemOneResponseModel(BaseModel):
    model: str
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer]
    usage: Usage
