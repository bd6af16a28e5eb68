"""Grammar-constrained generation: request shapes and refusals (no model), the matcher and the
mask on the real vocabulary, and a property test over random JSON Schemas on the real model:
every output that finished with "stop" parses and validates."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from onepass.contract import ContractError
from onepass.generate.grammar import (
    GrammarSpec,
    compile_grammar,
    grammar_from_response_format,
    grammar_request,
    tokenizer_info,
)
from onepass.generate.sampling import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def schema_format(schema: dict, name: str = "person") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def info(engine):
    return tokenizer_info(engine.backend)


def chat_ids(engine, text: str) -> list[int]:
    return engine.generator.chat_prompt([{"role": "user", "content": text}])


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# --------------------------------------------------------------------------- request shapes


def test_response_format_shapes():
    assert grammar_from_response_format(None) is None
    assert grammar_from_response_format({"type": "text"}) is None
    assert grammar_from_response_format({"type": "json_object"}) == GrammarSpec(json_object=True)
    spec = grammar_from_response_format(schema_format(PERSON))
    assert spec.json_schema == PERSON and spec.name == "person"
    assert spec.field == "response_format.json_schema.schema"
    flat = grammar_from_response_format(  # the Responses API's text.format
        {"type": "json_schema", "name": "p", "schema": PERSON}, "text.format"
    )
    assert flat.json_schema == PERSON and flat.field == "text.format.schema"
    assert grammar_request(None, 'start: "a"') == GrammarSpec(grammar='start: "a"', field="grammar")
    assert grammar_request({"type": "text"}, 'start: "a"').grammar == 'start: "a"'


@pytest.mark.parametrize(("raw", "field", "words"), [
    ("json", "response_format", "expected an object"),
    ({"type": "yaml"}, "response_format.type", "text, json_object, json_schema"),
    ({"type": "json_object", "schema": {}}, "response_format", "unknown key(s) schema"),
    ({"type": "json_schema"}, "response_format.schema", "needs a schema"),
    ({"type": "json_schema", "json_schema": []}, "response_format.json_schema", "an object"),
    ({"type": "json_schema", "json_schema": {"name": "x"}},
     "response_format.json_schema.schema", "needs a schema"),
    ({"type": "json_schema", "json_schema": {"schema": True}},
     "response_format.json_schema.schema", "JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict", "boolean"),
    ({"type": "json_schema", "json_schema": {"schema": {}, "name": "a b"}},
     "response_format.json_schema.name", "letters, digits"),
    ({"type": "json_schema", "json_schema": {"schema": {}, "format": "x"}},
     "response_format.json_schema", "unknown key(s) format"),
])
def test_bad_response_formats_name_the_field(raw, field, words):
    with pytest.raises(ContractError) as err:
        grammar_from_response_format(raw)
    assert err.value.field == field and words in err.value.message


def test_a_grammar_and_a_structured_format_together_are_refused():
    with pytest.raises(ContractError) as err:
        grammar_request({"type": "json_object"}, 'start: "a"')
    assert err.value.field == "grammar" and "cannot be combined" in err.value.message
    with pytest.raises(ContractError) as err:
        grammar_request(None, "  ")
    assert err.value.field == "grammar"


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("schema", "construct"), [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "integer"}}, "not"),
    ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}, "if"),
    ({"type": "array", "contains": {"const": 1}}, "contains"),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, "propertyNames"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
    ({"$ref": "https://example.com/person.json"}, "example.com"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"type": "string", "format": "phone-number"}, "phone-number"),
    ({"type": "string", "pattern": "^(?=a)a+$"}, "look-around"),
    # a schema's own x-guidance cannot switch the engine to lenient
    ({"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}, "uniqueItems"),
])
def test_unenforceable_constructs_are_refused_by_name(info, schema, construct):
    spec = grammar_from_response_format(schema_format(schema))
    with pytest.raises(ContractError) as err:
        spec.compile(info)
    assert err.value.field == "response_format.json_schema.schema"
    assert construct in err.value.message and "cannot be enforced" in err.value.message


def test_bad_grammars_are_refused_naming_the_field(info):
    for text, words in [('start: "a" "', "lexer error"), ("root ::= [0-9", "GBNF"),
                        ("start: undefined_rule", "undefined_rule"),
                        ("start: /a(?=b)/", "look-around"),
                        ('start: %json {"type": "array", "uniqueItems": true}', "uniqueItems")]:
        with pytest.raises(ContractError) as err:
            compile_grammar(info, grammar=text, field="grammar")
        assert err.value.field == "grammar" and words in err.value.message


def test_engine_generate_refuses_before_it_runs(engine):
    bad = schema_format({"type": "array", "uniqueItems": True})
    with pytest.raises(ContractError) as err:
        engine.generate("hi", response_format=bad, max_tokens=5)
    assert err.value.field == "response_format.json_schema.schema"
    with pytest.raises(ContractError) as err:
        engine.generate("hi", response_format={"type": "json_object"}, stop=["}"], max_tokens=5)
    assert err.value.field == "stop"


# --------------------------------------------------------------------------- compilation, matcher


def test_compiled_once_and_cached_by_canonical_text(info):
    first = compile_grammar(info, json_schema=PERSON)
    assert compile_grammar(info, json_schema=json.loads(json.dumps(PERSON))) is first
    reordered = {**PERSON, "properties": dict(reversed(PERSON["properties"].items()))}
    assert compile_grammar(info, json_schema=reordered) is not first  # order is output order
    assert compile_grammar(info, json_object=True) is compile_grammar(info, json_object=True)


def test_matcher_masks_allows_eos_only_when_complete_and_finishes(engine, info):
    tok = engine.backend
    grammar = compile_grammar(info, grammar='start: "yes" | "no" | "yes!"')
    m = grammar.matcher()
    mask = m.allowed_mask()
    assert mask.dtype == torch.bool and mask.numel() == tok.vocab_size
    allowed = mask.nonzero().flatten().tolist()
    assert allowed and all(
        any(w.startswith(tok.decode([t])) for w in ("yes", "no", "yes!")) for t in allowed
    )
    assert not any(mask[t] for t in tok.eos_ids)  # nothing generated yet: EOS forbidden
    for t in tok.encode("yes", bos=False):
        m.accept(t)
    assert m.is_accepting() and not m.done  # "yes" may end here or go on to "yes!"
    assert all(m.allowed_mask()[t] for t in tok.eos_ids)
    for t in tok.encode("!", bos=False):
        m.accept(t)
    assert m.done
    other = grammar.matcher()  # matchers are independent
    assert not other.is_accepting() and torch.equal(other.allowed_mask(), mask)
    wider = other.allowed_mask(tok.vocab_size + 7)
    assert wider.numel() == tok.vocab_size + 7 and not wider[tok.vocab_size:].any()


def test_a_refused_token_is_an_error_not_a_silent_advance(engine, info):
    from onepass.generate.grammar import GrammarError

    m = compile_grammar(info, grammar='start: "yes"').matcher()
    (bad,) = engine.backend.encode("no", bos=False)[:1]
    with pytest.raises(GrammarError):
        m.accept(bad)


# --------------------------------------------------------------------------- on the real model


def test_plus_100_bias_on_forbidden_tokens_never_gets_through(engine, info):
    backend = engine.backend
    grammar = compile_grammar(info, grammar='start: "yes" | "no"')
    maybe = backend.encode("maybe", bos=False)[0]
    eos = min(backend.eos_ids)
    bias = {str(maybe): 100, str(eos): 100}
    prompt = chat_ids(engine, "Answer maybe.")
    greedy = SamplingParams(temperature=0, logit_bias=bias)
    (g,) = engine.generator.run(prompt, greedy, 8, grammar=grammar)
    assert g.text in ("yes", "no") and g.finish_reason == "stop"
    hot = SamplingParams(temperature=2.0, seed=7, logit_bias=bias)
    for g in engine.generator.run(prompt, hot, 8, n=4, grammar=grammar):
        assert g.text in ("yes", "no") and g.finish_reason == "stop"
    free = SamplingParams(temperature=0, logit_bias={str(maybe): 100})
    (g,) = engine.generator.run(prompt, free, 3)  # without the grammar the bias wins
    assert g.text == "maybe" * 3


def test_json_schema_generation_streams_and_validates(engine):
    stream = engine.stream("Describe a person as JSON.", response_format=schema_format(PERSON),
                           temperature=1.0, seed=11, max_tokens=60)
    text = "".join(stream)
    assert stream.finish is not None and stream.finish.reason == "stop"
    validator(PERSON).validate(json.loads(text))


def test_json_object_validates(engine):
    reasons = []
    for seed in range(4):
        g = engine.generate("Reply with a JSON object.", response_format={"type": "json_object"},
                            temperature=1.0, seed=seed, max_tokens=60)
        reasons.append(g.finish_reason)
        if g.finish_reason == "stop":
            assert isinstance(json.loads(g.text), dict)
        else:
            assert g.text.startswith("{") and g.completion_tokens == 60
    assert "stop" in reasons


def test_with_a_grammar_eos_ends_the_sequence_even_with_ignore_eos(engine):
    eos = min(engine.backend.eos_ids)
    g = engine.generate("Say a number.", grammar="start: /[0-9]+/", temperature=0.0,
                        ignore_eos=True, logit_bias={str(eos): 100}, max_tokens=20)
    assert g.finish_reason == "stop" and g.completion_tokens == 2  # a digit, then EOS
    assert g.text.isdigit()
    free = engine.generate("Say a number.", temperature=0.0, ignore_eos=True,
                           logit_bias={str(eos): 100}, max_tokens=5)
    assert free.finish_reason == "length"  # without a grammar, ignore_eos ignores it


def test_a_length_limited_output_reports_length(engine):
    schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 200}},
              "required": ["story"]}
    g = engine.generate("Tell a story as JSON.", response_format=schema_format(schema),
                        temperature=1.0, seed=1, max_tokens=6)
    assert g.finish_reason == "length" and g.completion_tokens == 6
    assert g.text.startswith('{"story":"')


def test_a_gbnf_grammar_is_enforced(engine):
    g = engine.generate("Count to five.", grammar='root ::= [1-5] ("," [1-5]){2}',
                        temperature=1.0, seed=2, max_tokens=10)
    assert g.finish_reason == "stop"
    parts = g.text.split(",")
    assert len(parts) == 3 and all(p in "12345" and len(p) == 1 for p in parts)


# --------------------------------------------------------------------------- property test

WORDS = st.sampled_from(["red", "green", "blue", "cat", "dog", "x", "yes", "no"])
PATTERNS = st.sampled_from(["^[a-z]{2,5}$", "^[A-Z][a-z]{1,4}$", "^[0-9]{3}-[0-9]{2}$", "ab"])
FORMATS = ["date", "email", "uuid"]


@st.composite
def ranges(draw, kind: str) -> dict:
    out: dict = {"type": kind}
    value = st.integers(-50, 50) if kind == "integer" else st.floats(-50, 50, width=16)
    low, high = draw(value), draw(value)
    low, high = min(low, high), max(low, high)
    if draw(st.booleans()):
        out["minimum"] = low
    if draw(st.booleans()):
        out["maximum"] = high
    if kind == "integer" and low < high and draw(st.booleans()):
        out.pop("minimum", None)
        out["exclusiveMinimum"] = low
    return out


@st.composite
def strings(draw) -> dict:
    which = draw(st.sampled_from(["length", "pattern", "format", "enum"]))
    if which == "length":
        low = draw(st.integers(0, 3))
        return {"type": "string", "minLength": low, "maxLength": draw(st.integers(max(low, 1), 8))}
    if which == "pattern":
        return {"type": "string", "pattern": draw(PATTERNS), "maxLength": 8}
    if which == "format":
        return {"type": "string", "format": draw(st.sampled_from(FORMATS)), "maxLength": 40}
    return {"enum": draw(st.lists(WORDS, min_size=1, max_size=4, unique=True))}


LEAVES = st.one_of(
    ranges("integer"), ranges("number"), strings(), st.just({"type": "boolean"}),
    st.just({"$ref": "#/$defs/item"}),
)


def containers(children: st.SearchStrategy) -> st.SearchStrategy:
    @st.composite
    def array(draw) -> dict:
        low = draw(st.integers(0, 2))
        return {"type": "array", "items": draw(children), "minItems": low,
                "maxItems": draw(st.integers(max(low, 1), 3))}

    @st.composite
    def obj(draw) -> dict:
        names = draw(st.lists(WORDS, min_size=1, max_size=3, unique=True))
        props = {n: draw(children) for n in names}
        required = [n for n in names if draw(st.booleans())]
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}

    return st.one_of(array(), obj(), st.lists(children, min_size=2, max_size=2).map(
        lambda branches: {"anyOf": branches}))


@st.composite
def schemas(draw) -> dict:
    item = draw(st.one_of(ranges("integer"), strings()))
    body = draw(st.recursive(LEAVES, containers, max_leaves=4))
    root = {"type": "object", "properties": {"answer": body}, "required": ["answer"],
            "additionalProperties": False}
    return {"$defs": {"item": item}, **root}


@pytest.mark.proof
def test_random_schemas_generate_valid_json_on_the_real_model(engine, info):
    reasons: list[str] = []

    @settings(max_examples=15, deadline=None, derandomize=True, database=None)
    @given(schema=schemas(), seed=st.integers(0, 2**31))
    def check(schema: dict, seed: int) -> None:
        validator(schema)  # the schema itself is well-formed
        g = engine.generate("Fill in the answer as JSON.", response_format=schema_format(schema),
                            temperature=1.0, seed=seed, max_tokens=80)
        reasons.append(g.finish_reason)
        if g.finish_reason == "stop":
            validator(schema).validate(json.loads(g.text))
        else:
            assert g.finish_reason == "length" and g.completion_tokens == 80

    check()
    assert reasons.count("stop") >= len(reasons) * 2 // 3, reasons
