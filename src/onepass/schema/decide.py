"""The runner: a :class:`DecisionPlan` (options checked, schema and grammars compiled, no model
work) is decided field by field, in one of the two modes, into a :class:`SchemaDecision`:
sequential (one growing, cached prompt; each value written back as the assistant's reply, see
:func:`turn_break`) or batch (every field one branch of one packed forward over the context).

It drives an engine but imports none at run time (``onepass.engine`` only for type checking and,
lazily, for the chat template), so importing it loads no torch.
"""

from __future__ import annotations

import json
import random
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from onepass import prompt as P
from onepass.contract import ContractError, check_integer, finite_float
from onepass.limits import too_long, too_many, too_much_output
from onepass.readout import argmax_first, restricted_softmax
from onepass.schema.compile import MAX_FIELDS, compile_schema
from onepass.schema.fields import (
    CompiledSchema,
    SchemaField,
    _check_json,
    _field_error,
    _json_type,
    value_text,
)
from onepass.schema.open_branch import _generate_string, _generate_value, compile_constraints

if TYPE_CHECKING:
    from onepass.engine import DecisionEngine

Mode = Literal["sequential", "batch"]

MODES = ("sequential", "batch")
DEFAULT_OPEN_MAX_TOKENS = 32
MAX_OPEN_TOKENS = 512
MAX_GENERATED_TOKENS = 2048
"""Open text one request may generate in all: each open field's bound (``max_open_tokens``,
or ``maxLength + 1``) is summed before anything runs."""


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

