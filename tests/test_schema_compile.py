"""Schema compilation, validation, the open-branch string reader and the wire checks: pure,
no model (the engine-backed behaviour is in test_schema_engine.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from onepass import prompt as P
from onepass.backends.base import Capabilities
from onepass.contract import ContractError
from onepass.schema import (
    ESCAPE_KEY,
    MAX_DECISION_SECONDS,
    MAX_GENERATED_TOKENS,
    DecisionsRequestModel,
    _choose,
    _string_end,
    compile_schema,
    extend_schema,
    parse_decisions,
    read_json_string,
    turn_break,
    value_text,
)


def obj(**props):
    return {"type": "object", "properties": props}


# --------------------------------------------------------------------------- order and paths


def test_fields_follow_declared_order_and_nested_objects_flatten_with_dotted_paths():
    schema = obj(
        z={"enum": ["a", "b"]},
        inner=obj(deep=obj(flag={"type": "boolean"}), level={"x-score": [1, 2, 3]}),
        a={"const": 5},
    )
    compiled = compile_schema(schema)
    assert [f.path for f in compiled.fields] == ["z", "inner.deep.flag", "inner.level", "a"]
    assert [f.kind for f in compiled.fields] == ["enum", "boolean", "score", "enum"]
    value = compiled.assemble(
        {"z": "b", "inner.deep.flag": True, "inner.level": 2, "a": 5}
    )
    assert value == {"z": "b", "inner": {"deep": {"flag": True}, "level": 2}, "a": 5}
    assert list(value) == ["z", "inner", "a"]
    assert list(value["inner"]) == ["deep", "level"]
    assert compiled.validate(value) == []


def test_question_text_prefers_x_question_then_description_then_title():
    compiled = compile_schema(obj(
        a={"enum": [1, 2], "x-question": "Q?", "description": "D", "title": "T"},
        b={"enum": [1, 2], "description": "D", "title": "T"},
        c={"enum": [1, 2], "title": "T"},
        d={"enum": [1, 2]},
    ))
    assert [f.question for f in compiled.fields][:3] == ["Q?", "D", "T"]
    assert "d" in compiled.fields[3].question


def test_local_refs_resolve_and_sibling_keywords_override():
    schema = {
        "$defs": {"Colour": {"enum": ["red", "blue"], "description": "which colour"}},
        "type": "object",
        "properties": {"fg": {"$ref": "#/$defs/Colour", "description": "foreground?"},
                       "bg": {"$ref": "#/$defs/Colour"}},
    }
    fg, bg = compile_schema(schema).fields
    assert fg.values == bg.values == ("red", "blue")
    assert (fg.question, bg.question) == ("foreground?", "which colour")


# --------------------------------------------------------------------------- domains


def test_score_range_expands_to_exact_levels():
    (f,) = compile_schema(obj(s={"type": "number", "minimum": 0.0, "maximum": 1.0,
                                 "multipleOf": 0.1})).fields
    assert f.kind == "score"
    assert f.values == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    (g,) = compile_schema(obj(s={"type": "integer", "minimum": 1, "maximum": 5})).fields
    assert g.values == (1, 2, 3, 4, 5) and all(type(v) is int for v in g.values)
    (h,) = compile_schema(obj(s={"type": "number", "minimum": 0.05, "maximum": 0.5,
                                 "multipleOf": 0.25})).fields
    assert h.values == (0.25, 0.5)  # multiples of the step inside the bounds
    (k,) = compile_schema(obj(s={"type": "number", "minimum": 1, "maximum": 2,
                                 "x-step": 0.5})).fields
    assert k.values == (1.0, 1.5, 2.0)


def test_enum_kinds_and_option_texts():
    compiled = compile_schema(obj(
        mixed={"enum": ["low", 2, 2.5, None, ""]},
        ordered={"enum": ["low", "mid", "high"], "x-score": True},
        flag={"type": "boolean"},
        nullable={"type": ["boolean", "null"]},
        nothing={"type": "null"},
        union={"anyOf": [{"enum": ["a"]}, {"const": "b"}, {"type": "null"}]},
    ))
    mixed, ordered, flag, nullable, nothing, union = compiled.fields
    assert mixed.keys_text == ("low", "2", "2.5", "null", "")
    assert mixed.option_names() == ("low", "2", "2.5", "null", '""')
    assert ordered.kind == "score" and ordered.values == ("low", "mid", "high")
    assert flag.values == (True, False) and flag.keys_text == ("true", "false")
    assert nullable.values == (True, False, None)
    assert nothing.trivial and not flag.trivial
    assert union.values == ("a", "b", None)


def test_open_enum_adds_one_escape_candidate_after_the_declared_values():
    (f,) = compile_schema(obj(v={"enum": ["meal", "travel"], "x-open": True,
                                 "maxLength": 12})).fields
    assert f.open and f.values == ("meal", "travel")
    assert f.keys_text == ("meal", "travel", ESCAPE_KEY)
    assert f.option_names() == ("meal", "travel", "other")
    assert f.contains("travel") and f.contains("conference") and not f.contains("x" * 13)
    (g,) = compile_schema(obj(v={"type": "string", "x-open": "something else"})).fields
    assert g.kind == "open" and g.values == () and g.option_names() == ("something else",)


def test_values_keep_their_json_type_in_the_domain_check():
    (f,) = compile_schema(obj(v={"enum": [1, "2", True, None]})).fields
    assert f.contains(1) and f.contains(1.0) and f.contains("2") and f.contains(True)
    assert not f.contains("1") and not f.contains(2) and not f.contains(False)
    assert not f.contains("true") and not f.contains(0)
    assert value_text(None) == "null" and value_text("x") == "x" and value_text(0.1) == "0.1"


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("prop", "words"),
    [
        ({"type": "string"}, ["free string", "x-open"]),
        ({"type": "number"}, ["no finite domain", "minimum"]),
        ({"type": "integer", "minimum": 0}, ["no finite domain"]),
        ({"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.05}, ["11 levels"]),
        ({"type": "integer", "minimum": 0, "maximum": 100}, ["11 levels"]),
        ({}, ["no finite domain"]),
        ({"type": "array", "items": {"enum": [1]}}, ["arrays"]),
        ({"enum": [{"a": 1}]}, ["strings, numbers"]),
        ({"enum": []}, ["non-empty"]),
        ({"enum": ["1", 1]}, ["distinct"]),
        ({"enum": ["a", "x-open"]}, ["reserved"]),
        ({"enum": ["a", 1], "type": "string"}, ["not string"]),
        ({"allOf": [{"enum": [1]}]}, ["allOf"]),
        ({"type": "boolean", "x-open": True}, ["x-open"]),
        # open values are generated under their constraints: only malformed ones are refused
        # here (what the grammar engine cannot enforce is refused by parse_decisions)
        ({"type": "string", "x-open": True, "minLength": -1}, ["minLength", "non-negative"]),
        ({"type": "string", "x-open": True, "pattern": 7}, ["pattern", "string"]),
        ({"type": "integer", "x-open": True, "exclusiveMinimum": True}, ["finite number"]),
        ({"type": "number", "x-open": True, "multipleOf": 0}, ["greater than 0"]),
        ({"enum": [5, 50], "type": "integer", "x-open": True, "maximum": 10},
         ["declared value 50", "maximum"]),
        ({"enum": ["abcdef"], "x-open": True, "minLength": 1, "maxLength": 3},
         ["'abcdef'", "maxLength"]),
        ({"type": "integer", "x-open": True, "x-score": True, "minimum": 0, "maximum": 3},
         ["x-open"]),
        ({"enum": ["other"], "x-open": True}, ["escape text"]),
        ({"x-score": [1, 2], "type": "string"}, ["not string"]),
        ({"$ref": "#/nowhere"}, ["points at nothing"]),
        ({"$ref": "http://example.com/s.json"}, ["local"]),
        ({"type": "object"}, ["properties"]),
        # client numbers past what a double holds: refusals, never an OverflowError (a 500)
        ({"type": "number", "minimum": 0, "maximum": 1e300, "multipleOf": 1e-300},
         ["overflow a double"]),
        ({"type": "number", "minimum": 0, "maximum": 1e300, "x-step": 1e-300},
         ["overflow a double"]),
        ({"type": "integer", "minimum": -10**308, "maximum": 10**308}, ["overflow a double"]),
        ({"type": "integer", "minimum": 0, "maximum": 10**400}, ["a double can hold"]),
        ({"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 5e-324},
         ["overflow a double"]),
    ],
)
def test_refusals_name_the_field(prop, words):
    with pytest.raises(ContractError) as err:
        compile_schema(obj(ok={"type": "boolean"}, outer=obj(bad=prop)))
    assert err.value.field == "schema.properties.outer.properties.bad"
    message = str(err.value)
    assert "outer.bad" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        ([], "schema"),
        ({"type": "object"}, "schema"),
        ({"properties": {}}, "schema.properties"),
        ({"properties": {"a.b": {"type": "boolean"}}}, "schema.properties.a.b"),
        ({"properties": {"a": {"type": "boolean"}}, "x": float("nan")}, "schema.x"),
    ],
)
def test_refusals_of_the_whole_schema(schema, field):
    with pytest.raises(ContractError) as err:
        compile_schema(schema)
    assert err.value.field == field


def test_recursive_refs_and_deep_nesting_are_refused_not_crashed():
    with pytest.raises(ContractError) as err:
        compile_schema({"properties": {"a": {"$ref": "#"}}})
    assert "recursive" in err.value.message and err.value.field.startswith("schema.properties.a")
    deep: dict = {"enum": [1]}
    for _ in range(200):
        deep = {"properties": {"x": deep}}
    with pytest.raises(ContractError) as err:
        compile_schema(deep)
    assert "nested" in err.value.message


def _fan_out(depth: int, bottom: dict) -> dict:
    """About 100 bytes a level, each level's object holding the next level twice: expanding
    the references visits 2**depth objects."""
    defs = {f"L{i}": obj(a={"$ref": f"#/$defs/L{i + 1}"}, b={"$ref": f"#/$defs/L{i + 1}"})
            for i in range(depth)}
    defs[f"L{depth}"] = bottom
    return {"$defs": defs, **obj(x={"$ref": "#/$defs/L0"})}


def test_a_reference_fan_out_is_refused_by_the_step_budget_naming_where():
    # 2 KB that expands to 2**18 empty objects: 1.2 s of compilation before the budget (x4
    # per two levels: depth 30 held the engine worker for hours), then "no field to decide"
    bomb = _fan_out(18, obj())
    assert len(json.dumps(bomb)) < 2500
    with pytest.raises(ContractError) as err:
        compile_schema(bomb)
    assert "steps" in err.value.message and "'$ref'" in err.value.message
    assert err.value.field.startswith("schema.properties.x.properties.")
    # the same through anyOf: 1,000 references to one 255-value enum is 255,000 values
    enum = {"enum": [f"v{i}" for i in range(255)]}
    fan = {"$defs": {"E": enum}, **obj(f={"anyOf": [{"$ref": "#/$defs/E"}] * 1000})}
    with pytest.raises(ContractError) as err:
        compile_schema(fan)
    assert "steps" in err.value.message and err.value.field == "schema.properties.f"


def test_the_step_budget_leaves_room_for_the_largest_legitimate_schema():
    enum = {"enum": [f"v{i}" for i in range(255)], "description": "Which one?"}
    fields = {f"f{i}": {"$ref": "#/$defs/E"} for i in range(256)}
    compiled = compile_schema({"$defs": {"E": enum}, **obj(**fields)})
    assert len(compiled.fields) == 256 and all(len(f.values) == 255 for f in compiled.fields)
    # repeated anyOf branches collapse to the declared values
    union = {"$defs": {"E": enum}, **obj(f={"anyOf": [{"$ref": "#/$defs/E"}] * 20})}
    (f,) = compile_schema(union).fields
    assert f.values == tuple(enum["enum"])


def test_numbers_past_a_double_are_values_not_overflows():
    (f,) = compile_schema(obj(n={"enum": [10**400, 1]})).fields
    assert f.contains(10**400) and f.contains(1.0) and not f.contains(10**400 + 1)
    (u,) = compile_schema(obj(n={"anyOf": [{"const": 10**400}, {"const": 10**400},
                                            {"const": 1}]})).fields
    assert u.values == (10**400, 1)
    (g,) = compile_schema(obj(n={"type": "integer", "minimum": 10**20,
                                 "maximum": 10**20 + 2})).fields
    assert g.values == (10**20, 10**20 + 1, 10**20 + 2)  # exact: not rounded through a double
    assert compile_schema(obj(n={"enum": [1]})).validate({"n": {"a": 1}}) == [
        "n: {'a': 1} is not a declared value"]


def test_validate_reports_values_outside_the_domain_and_missing_fields():
    compiled = compile_schema(obj(a={"enum": ["x", "y"]}, b=obj(c={"type": "boolean"})))
    assert compiled.validate({"a": "x", "b": {"c": False}}) == []
    problems = compiled.validate({"a": "z", "b": {}})
    assert any(p.startswith("a:") for p in problems) and "b.c: missing" in problems
    assert compiled.validate({"a": "x", "b": 3}) != []


def test_extend_schema_declares_learned_values_without_touching_shared_defs():
    schema = {
        "$defs": {"V": {"enum": ["airline", "hotel"], "x-open": True}},
        "properties": {"vendor": {"$ref": "#/$defs/V"}, "title": {"type": "string",
                                                                  "x-open": True}},
    }
    extended = extend_schema(schema, {"vendor": "conference", "title": "Trip"})
    assert schema["$defs"]["V"]["enum"] == ["airline", "hotel"]  # the input is not modified
    vendor, title = compile_schema(extended).fields
    assert vendor.values == ("airline", "hotel", "conference") and vendor.open
    assert title.values == ("Trip",) and title.kind == "enum" and title.open
    assert extend_schema(extended, {"vendor": "conference"}) == extended  # idempotent
    with pytest.raises(ContractError):
        extend_schema(schema, {"nope": "x"})


# --------------------------------------------------------------------------- open branch text


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('conference registration", "x', "conference registration"),
        ("say \\\"hi\\\" now\"", 'say "hi" now'),
        ("tab\\tand\\u00e9\"", "tab\tand\u00e9"),
        ("cut off \\", "cut off "),
        ("cut off \\u00", "cut off u00"),
        ("line one\nline two", "line one"),
        ("bad \\q escape", "bad q escape"),
        ("lone \\ud800 surrogate", "lone  surrogate"),
        ("", ""),
    ],
)
def test_read_json_string_always_yields_a_valid_string(body, expected):
    value = read_json_string(body)
    assert value == expected
    assert json.loads(json.dumps(value)) == value
    value.encode("utf-8")  # no lone surrogates


def test_read_json_string_cuts_to_max_length_and_string_end_finds_the_close():
    assert read_json_string("abcdefgh", max_length=3) == "abc"
    assert _string_end('ab\\"c"d') == 5
    assert _string_end("abc") is None
    assert _string_end("a\nb") == 1


# --------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_with_a_seed_and_follows_the_distribution():
    probs = [0.2, 0.5, 0.3]
    a = [_choose(probs, random.Random(11)) for _ in range(5)]
    rng1, rng2 = random.Random(11), random.Random(11)
    assert [_choose(probs, rng1) for _ in range(50)] == [_choose(probs, rng2) for _ in range(50)]
    assert len(set(a)) == 1  # a fresh Random(11) draws the same first value every time
    rng = random.Random(0)
    draws = [_choose(probs, rng) for _ in range(4000)]
    for i, p in enumerate(probs):
        assert abs(draws.count(i) / len(draws) - p) < 0.03
    assert {_choose([0.0, 1.0, 0.0], random.Random(s)) for s in range(20)} == {1}
    assert _choose([0.4, 0.4, 0.2], None) == 0  # argmax: the first of a tie


# --------------------------------------------------------------------------- wire checks


class FakeEngine:
    """Enough engine for the request checks that run before any model work."""

    served_name = "smollm2-135m-instruct"
    temperature = 1.0
    backend = SimpleNamespace()
    capabilities = Capabilities()  # a backend that only scores labels

    def check_model(self, requested):
        if requested not in (None, "jev-latest", self.served_name):
            raise ContractError("model", f"unknown model {requested!r}", kind="model_not_found")


GOOD = {"context": "c", "schema": obj(a={"type": "boolean"}), "mode": "batch"}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"model": "gpt-4"}, "model"),
        ({"model": 3}, "model"),
        ({"context": None}, "context"),
        ({"context": float("inf")}, "context"),
        ({"schema": "x"}, "schema"),
        ({"schema": {"properties": {"a": {"type": "string"}}}}, "schema.properties.a"),
        ({"mode": "parallel"}, "mode"),
        ({"temperature": 0}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"sample": "yes"}, "sample"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"max_open_tokens": 0}, "max_open_tokens"),
    ],
)
def test_parse_decisions_refuses_bad_bodies_naming_the_field(patch, field):
    with pytest.raises(ContractError) as err:
        parse_decisions(FakeEngine(), {**GOOD, **patch})
    assert err.value.field == field


@pytest.mark.parametrize("missing", ["context", "schema", "mode"])
def test_parse_decisions_requires_context_schema_and_mode(missing):
    body = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ContractError) as err:
        parse_decisions(FakeEngine(), body)
    assert err.value.field == missing and "required" in err.value.message
    with pytest.raises(ContractError) as err:
        parse_decisions(FakeEngine(), [GOOD])
    assert err.value.field == "body"


def test_a_plan_bounds_the_fields_and_the_open_text_of_one_request():
    many = {**GOOD, "schema": obj(**{f"f{i}": {"type": "boolean"} for i in range(9)})}
    with pytest.raises(ContractError) as err:
        parse_decisions(FakeEngine(), many, max_fields=8)
    assert (err.value.kind, err.value.field) == ("too_many_questions", "schema")
    assert "9 fields is over the limit of 8" in err.value.message
    plan = parse_decisions(FakeEngine(), many, max_fields=9)
    assert len(plan.compiled.fields) == 9 and plan.time_limit == MAX_DECISION_SECONDS
    engine = FakeEngine()
    engine.capabilities = Capabilities(generates=True, generation_steps=True)  # open fields
    text = {"type": "string", "x-open": True}
    wide = {**GOOD, "schema": obj(**{f"t{i}": text for i in range(5)}), "max_open_tokens": 512}
    with pytest.raises(ContractError) as err:
        parse_decisions(engine, wide)
    assert (err.value.kind, err.value.field) == ("max_tokens_exceeded", "max_open_tokens")
    assert f"may generate 2560 tokens, over the limit of {MAX_GENERATED_TOKENS}" in str(err.value)
    short = {**wide, "schema": obj(**{f"t{i}": {**text, "maxLength": 9} for i in range(5)})}
    assert parse_decisions(engine, short).max_open_tokens == 512  # 5 x (maxLength + 1) tokens
    default = {**GOOD, "schema": obj(**{f"t{i}": text for i in range(64)})}
    assert len(parse_decisions(engine, default).compiled.fields) == 64  # 64 x 32 fits


def test_request_model_documents_the_body_under_its_wire_names():
    parsed = DecisionsRequestModel.model_validate({**GOOD, "seed": 3})
    assert parsed.schema_ == GOOD["schema"] and parsed.mode == "batch" and parsed.seed == 3
    doc = DecisionsRequestModel.model_json_schema(by_alias=True)
    assert {"context", "schema", "mode"} <= set(doc["required"])
    assert doc["properties"]["mode"]["enum"] == ["sequential", "batch"]


def test_schema_module_imports_no_torch():
    code = "import sys, onepass.schema; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- prompt growth


def _chatml(messages):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + "<|im_start|>assistant\n"


def _no_system_role(messages):
    if messages[0]["role"] == "system":
        raise ValueError("System role not supported")
    turns = {"user": "user", "assistant": "model"}
    out = "<bos>" + "".join(
        f"<start_of_turn>{turns[m['role']]}\n{m['content']}<end_of_turn>\n" for m in messages
    )
    return out + "<start_of_turn>model\n"


@pytest.mark.parametrize(
    ("render", "expected"),
    [
        (_chatml, "<|im_end|>\n<|im_start|>user\n"),
        (_no_system_role, "<end_of_turn>\n<start_of_turn>user\n"),
        (None, "\n\n"),
    ],
)
def test_turn_break_comes_from_the_chat_template(render, expected):
    backend = SimpleNamespace(chat_template="t" if render else None, render_chat=render)
    fmt = P.ChatFormat.from_template(render) if render else P.PLAIN_FORMAT
    engine = FakeEngine()  # weak-referenceable, like a real engine (turn_break memoises)
    engine.format, engine.backend = fmt, backend
    brk = turn_break(engine)
    assert brk == expected
    if render:  # one turn + value + break + next question + tail == the two-turn render
        two = render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                      {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}]
                     ) if render is _chatml else render(
            [{"role": "user", "content": "S" + fmt.middle + "U"},
             {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}])
        assert two == fmt.head + "S" + fmt.middle + "U" + fmt.tail + "A" + brk + "V" + fmt.tail
