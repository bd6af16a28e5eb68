"""The OpenAI Decisions protocol (server/decisions_openai.py), pure: every hostile body is a
ContractError naming its field, good ones render the documented state and questions, and the
response parses with the official SDK's Decision model."""

from __future__ import annotations

import pytest

from onepass.contract import ContractError, parse_request
from onepass.server import decisions_openai as D

PRED = {"type": "predicate", "instructions": "The text is a greeting."}


def body(**over):
    return {"model": "jev-latest", "input": "Hello there!", "questions": [PRED], **over}


def choice(values, **over):
    return {"type": "choice", "instructions": "Which?",
            "choices": [{"value": v} for v in values], **over}


def fails(raw, field, words=""):
    with pytest.raises(ContractError) as info:
        D.parse_body(raw)
    assert info.value.field == field, (info.value.field, info.value.message)
    assert words.lower() in info.value.message.lower()
    return info.value


# --------------------------------------------------------------------------- wrong types

@pytest.mark.parametrize("raw,field", [
    ([], "body"), ("x", "body"), (None, "body"), (3, "body"),
    ({"input": "x", "questions": [PRED]}, "model"),
    (body(model=3), "model"), (body(model=""), "model"), (body(model=None), "model"),
    (body(model=["m"]), "model"),
    ({"model": "m", "questions": [PRED]}, "input"),
    (body(input=None), "input"), (body(input=3), "input"), (body(input={}), "input"),
    (body(input=[]), "input"), (body(input=True), "input"),
    (body(input=[3]), "input[0]"), (body(input=["x"]), "input[0]"),
    (body(questions=None), "questions"), (body(questions={}), "questions"),
    (body(questions="q"), "questions"), (body(questions=[3]), "questions[0]"),
    (body(questions=[{"instructions": "x"}]), "questions[0].type"),
    (body(questions=[{**PRED, "type": "noul"}]), "questions[0].type"),
    (body(questions=[{**PRED, "type": 1}]), "questions[0].type"),
    (body(questions=[{"type": "predicate"}]), "questions[0].instructions"),
    (body(questions=[{**PRED, "instructions": 3}]), "questions[0].instructions"),
    (body(questions=[{**PRED, "instructions": None}]), "questions[0].instructions"),
    (body(questions=[{**PRED, "instructions": "  "}]), "questions[0].instructions"),
    (body(questions=[{**PRED, "instructions": []}]), "questions[0].instructions"),
    (body(questions=[{**PRED, "instructions": [{"type": "input_text", "text": 3}]}]),
     "questions[0].instructions[0].text"),
    (body(questions=[{**PRED, "name": 3}]), "questions[0].name"),
    (body(questions=[PRED, {**PRED, "name": ["a"]}]), "questions[1].name"),
    (body(questions=[{**PRED, "name": True}]), "questions[0].name"),
    (body(questions=[choice(["a", "b"], choices=None)]), "questions[0].choices"),
    (body(questions=[choice(["a", "b"], choices={"a": 1})]), "questions[0].choices"),
    (body(questions=[choice(["a", 1])]), "questions[0].choices[1].value"),
    (body(questions=[choice(["a", None])]), "questions[0].choices[1].value"),
    (body(questions=[choice(["a", ["b"]])]), "questions[0].choices[1].value"),
    (body(questions=[{**choice(["a"]), "choices": [{"value": "a"}, "b"]}]),
     "questions[0].choices[1]"),
    (body(questions=[{**choice(["a"]), "choices": [{"value": "a"}, {"description": "b"}]}]),
     "questions[0].choices[1].value"),
    (body(questions=[{**choice(["a"]), "choices": [{"value": "a"},
                                                   {"value": "b", "description": 3}]}]),
     "questions[0].choices[1].description"),
    (body(questions=[{"type": "score", "instructions": "x", "levels": "abc"}]),
     "questions[0].levels"),
    (body(questions=[{"type": "score", "instructions": "x",
                      "levels": [{"label": "a"}, {"label": 2}]}]),
     "questions[0].levels[1].label"),
    (body(questions=[{"type": "score", "instructions": "x",
                      "levels": [{"label": "a"}, {"label": ""}]}]),
     "questions[0].levels[1].label"),
    (body(questions=[{"type": "score", "instructions": "x",
                      "levels": [{"label": "a"}, "b"]}]), "questions[0].levels[1]"),
    (body(prompt_cache_key=3), "prompt_cache_key"),
    (body(prompt_cache_key="k" * (D.MAX_CACHE_KEY + 1)), "prompt_cache_key"),
    (body(prompt_cache_options="implicit"), "prompt_cache_options"),
    (body(prompt_cache_options={"mode": "sometimes"}), "prompt_cache_options.mode"),
    (body(prompt_cache_options={"mode": 1}), "prompt_cache_options.mode"),
    (body(prompt_cache_options={"ttl": "1h"}), "prompt_cache_options.ttl"),
    (body(prompt_cache_options={"ttl": 30}), "prompt_cache_options.ttl"),
    (body(prompt_cache_options={"size": 3}), "prompt_cache_options.size"),
    (body(safety_identifier=12), "safety_identifier"),
    (body(safety_identifier="u" * 65), "safety_identifier"),
    (body(temperature=0), "temperature"), (body(temperature="hot"), "temperature"),
    (body(debias="sideways"), "debias"),
])
def test_wrong_types_name_the_field(raw, field):
    fails(raw, field)


# --------------------------------------------------------------------------- counts


def test_question_count_limits():
    fails(body(questions=[]), "questions", "1 to 400")
    fails(body(questions=[PRED] * 401), "questions", "got 401")
    call = D.parse_body(body(questions=[PRED] * 400))
    assert len(call.asked) == 400 and [a.key for a in call.asked][-1] == "q399"


def test_choice_count_limits():
    fails(body(questions=[choice(["only"])]), "questions[0].choices", "2 to 255")
    fails(body(questions=[choice([f"v{i}" for i in range(256)])]), "questions[0].choices",
          "got 256")
    call = D.parse_body(body(questions=[choice([f"v{i}" for i in range(255)])]))
    assert len(call.asked[0].values) == 255


def test_score_levels_respect_the_onepass_limit():
    levels = [{"label": str(i)} for i in range(11)]
    fails(body(questions=[{"type": "score", "instructions": "x", "levels": levels}]),
          "questions[0].levels", "at most 10")
    fails(body(questions=[{"type": "score", "instructions": "x", "levels": levels[:1]}]),
          "questions[0].levels")
    call = D.parse_body(body(questions=[{"type": "score", "instructions": "x",
                                         "levels": levels[:10]}]))
    assert call.asked[0].labels == tuple(str(i) for i in range(10))


# --------------------------------------------------------------------------- choices


def test_duplicate_choice_values_are_refused_naming_the_index():
    fails(body(questions=[choice(["a", "b", "a"])]), "questions[0].choices[2].value",
          "choices[0]")
    fails(body(questions=[PRED, choice([True, "x", True])]), "questions[1].choices[2].value")


def test_a_string_and_a_boolean_of_the_same_text_are_distinct_choices():
    call = D.parse_body(body(questions=[choice(["true", True, False, "false", "maybe"])]))
    q = call.asked[0]
    assert q.values == ("true", True, False, "false", "maybe")
    assert [type(v) for v in q.values] == [str, bool, bool, str, str]
    assert len(set(q.options)) == 5
    assert q.options == ('"true"', "true", "false", '"false"', "maybe")
    criteria = call.system_one["questions"]["q0"]["criteria"]
    assert list(criteria) == list(q.options)


def test_option_names_are_unique_whatever_the_values():
    values = ["true", True, '"true"', " ", "", '"true" #3']
    names = D.option_names(values)
    assert len(set(names)) == len(names) and all(n.strip() for n in names)


def test_choice_descriptions_and_score_levels_render_as_system_one_criteria():
    call = D.parse_body(body(questions=[
        {"type": "choice", "instructions": "Which?", "choices": [
            {"value": "a", "description": "the first"}, {"value": "b"},
            {"value": "c", "description": " "}]},
        {"type": "score", "instructions": "How?", "levels": [
            {"label": "low"}, {"label": "high", "description": "very"}]}]))
    wire = call.system_one["questions"]
    assert wire["q0"]["criteria"] == {"a": "the first", "b": None, "c": None}
    assert wire["q1"]["criteria"] == ["low", "high: very"]


# --------------------------------------------------------------------------- input


def test_a_string_input_is_the_system_one_state():
    raw = {"model": "m", "input": "  Hi!\n", "questions": [PRED]}
    call = D.parse_body(raw)
    assert call.request == parse_request({"model": "m", "state": "  Hi!\n", "questions": {
        "q0": {"type": "noul", "instructions": PRED["instructions"]}}})
    lone = D.parse_body({**raw, "input": [{"role": "user", "content": "  Hi!\n"}]})
    assert lone.request.state == call.request.state
    parts = D.parse_body({**raw, "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "  Hi!\n"}]}]})
    assert parts.request.state == call.request.state


def test_items_render_as_an_ordered_role_labelled_transcript():
    items = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"},
                                     {"type": "input_json", "data": {"city": "Paris"}}]},
        {"type": "function_call", "call_id": "c1", "name": "weather",
         "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "sql", "input": "SELECT 1",
         "namespace": "db"},
        {"type": "custom_tool_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "1"}]},
        {"role": "assistant", "phase": "final_answer", "content": [
            {"type": "output_text", "text": "It is sunny."},
            {"type": "refusal", "refusal": "No more."}]},
    ]
    state = D.parse_body(body(input=items)).request.state
    assert state == (
        "System: Be brief.\n\nDeveloper: Rules.\n\n"
        'User: Weather?\n{"city": "Paris"}\n\n'
        'Function call weather (call_id c1): {"city":"Paris"}\n\n'
        "Function output (call_id c1): Sunny\n\n"
        "Custom tool call db.sql (call_id c2): SELECT 1\n\n"
        "Custom tool output (call_id c2): 1\n\n"
        "Assistant: It is sunny.\nRefusal: No more.")
    assert D.parse_body(body(input=items)).request.state == state  # deterministic


def test_a_lone_json_part_is_the_state_as_json():
    data = {"order": 42, "items": ["a"]}
    call = D.parse_body(body(input=[{"role": "user", "content": [
        {"type": "input_json", "data": data}]}]))
    assert call.request.state == data


@pytest.mark.parametrize("items,field,words", [
    ([{"type": "function_call_output", "call_id": "x", "output": "o"}],
     "input[0].call_id", "no earlier function_call"),
    ([{"role": "user", "content": "u"},
      {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
      {"type": "custom_tool_call_output", "call_id": "a", "output": "o"}],
     "input[2].call_id", "custom_tool_call"),
    ([{"role": "user", "content": "u"}, {"role": "user", "content": "v"},
      {"type": "function_call_output", "call_id": "z", "output": "o"},
      {"type": "function_call", "call_id": "z", "name": "f", "arguments": "{}"}],
     "input[2].call_id", "follow its call"),
    ([{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "a", "name": "g", "arguments": "{}"}],
     "input[1].call_id", "already used"),
    ([{"type": "function_call", "call_id": 3, "name": "f", "arguments": "{}"}],
     "input[0].call_id", "string"),
    ([{"type": "function_call", "call_id": "a", "name": "f"}], "input[0].arguments", ""),
    ([{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}",
       "status": "done"}], "input[0].status", ""),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}],
     "input[0].content[0].type", "text-only"),
    ([{"role": "user", "content": "a"}, {"type": "function_call", "call_id": "a", "name": "f",
                                         "arguments": "{}"},
      {"type": "function_call_output", "call_id": "a",
       "output": [{"type": "input_image", "image_url": "https://x"}]}],
     "input[2].output[0].type", "text-only"),
    ([{"role": "system", "content": [{"type": "input_image", "image_url": "x"}]}],
     "input[0].content[0].type", "text-only"),
    ([{"role": "tool", "content": "x"}], "input[0].role", "tool"),
    ([{"role": "user"}], "input[0].content", "required"),
    ([{"role": "user", "content": 3}], "input[0].content", ""),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
     "input[0].content[0].type", ""),
    ([{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
     "input[0].content[0].type", ""),
    ([{"role": "assistant", "content": "x", "phase": "later"}], "input[0].phase", ""),
    ([{"type": "reasoning", "summary": []}], "input[0].type", "reasoning"),
    ([{"role": "user", "content": "x", "name": "bob"}], "input[0].name", "unknown"),
    ([{"role": "user", "content": [{"type": "input_json", "data": 3}]}],
     "input[0].content[0].data", ""),
    ([{"role": "user", "content": [{"type": "input_json", "data": [1]}]}],
     "input[0].content[0].data", ""),
    ([{"role": "user", "content": [{"type": "input_text", "text": "x",
                                    "prompt_cache_breakpoint": {"mode": "implicit"}}]}],
     "input[0].content[0].prompt_cache_breakpoint.mode", ""),
])
def test_bad_items_name_the_field(items, field, words):
    fails(body(input=items), field, words)


def test_instruction_parts_accept_text_and_refuse_images():
    call = D.parse_body(body(questions=[{**PRED, "instructions": [
        {"type": "input_text", "text": "Is it"}, {"type": "input_text", "text": "a greeting?"}]}]))
    assert call.request.questions[0].instructions == "Is it\na greeting?"
    fails(body(questions=[{**PRED, "instructions": [
        {"type": "input_image", "image_url": "https://x/y.png"}]}]),
        "questions[0].instructions[0].type", "text-only")


def test_breakpoints_are_accepted():
    D.parse_body(body(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "x", "prompt_cache_breakpoint": {"mode": "explicit"}}]}],
        prompt_cache_options={"mode": "explicit", "ttl": "30m"}))


# --------------------------------------------------------------------------- unknown fields


@pytest.mark.parametrize("field", sorted(D.REFUSED_FIELDS))
def test_fields_that_would_change_the_answer_are_refused(field):
    fails(body(**{field: 1}), field, "not supported")


def test_other_unknown_top_level_fields_are_accepted():
    call = D.parse_body(body(metadata={"a": "b"}, user="u", store=False, service_tier="auto"))
    assert call.model == "jev-latest"


@pytest.mark.parametrize("question,field", [
    ({**PRED, "criteria": {"yes": "y"}}, "questions[0].criteria"),
    ({**PRED, "choices": [{"value": "a"}, {"value": "b"}]}, "questions[0].choices"),
    ({**choice(["a", "b"]), "levels": []}, "questions[0].levels"),
    ({**choice(["a"]), "choices": [{"value": "a"}, {"value": "b", "descripton": "x"}]},
     "questions[0].choices[1].descripton"),
    ({"type": "score", "instructions": "x", "levels": [{"label": "a", "score": 1},
                                                       {"label": "b"}]},
     "questions[0].levels[0].score"),
])
def test_unknown_keys_inside_closed_shapes_are_refused(question, field):
    fails(body(questions=[question]), field, "unknown field")


# --------------------------------------------------------------------------- sizes


def test_huge_strings_parse_in_linear_time_and_no_fault_is_a_crash():
    big = "x" * 2_000_000
    assert D.parse_body(body(input=big)).request.state == big
    fails(body(model=3, input=big), "model")
    fails(body(input=[{"role": "user", "content": [{"type": "input_json", "data": {
        "k": "v" * (D.MAX_JSON_PART_BYTES + 1)}}]}]), "input[0].content[0].data", "limit")
    call = D.parse_body(body(questions=[{**PRED, "name": big}]))
    assert call.asked[0].name == big


# --------------------------------------------------------------------------- response


def test_cache_key_reaches_the_engine_request():
    assert D.parse_body(body(prompt_cache_key="tenant-a")).request.cache_namespace == "tenant-a"
    assert D.parse_body(body()).request.cache_namespace is None


def test_response_in_question_order_with_typed_values_parses_with_the_sdk():
    openai = pytest.importorskip("openai")
    from openai.types.decision import Decision

    call = D.parse_body(body(questions=[
        {**PRED, "name": "dup"},
        {**choice([True, "true"]), "name": "dup"},
        {"type": "score", "instructions": "x", "levels": [{"label": "lo"}, {"label": "hi"}]},
        PRED,
    ]))
    result = {"model": "served", "answers": {
        "q0": {"type": "noul", "noul": 0.75},
        "q1": {"type": "choice", "choice": '"true"', "probabilities": {"true": 0.4,
                                                                      '"true"': 0.6},
               "confidence": 0.2},
        "q2": {"type": "score", "score": 0.3, "legend": {"0": "lo", "1": "hi"},
               "probabilities": {"0": 0.7, "1": 0.3}, "confidence": 0.5},
        "q3": {"type": "noul", "noul": 0.5, "abstained": True},
    }, "usage": {"input_tokens": 100, "output_tokens": 4, "cached_tokens": 40,
                 "cache_write_tokens": 30}}
    out = D.build_response(call, result)
    decision = Decision.model_validate(out)
    a = decision.answers
    assert [x.type for x in a] == ["predicate", "choice", "score", "refusal"]
    assert [x.name for x in a] == ["dup", "dup", None, None]
    assert a[0].probability == 0.75
    assert a[1].choice == "true" and type(a[1].choice) is str
    assert [(type(p.value), p.probability) for p in a[1].probabilities] == [(bool, 0.4),
                                                                            (str, 0.6)]
    assert a[2].score == 0.3 and [(p.label, p.value) for p in a[2].probabilities] == [
        ("lo", 0), ("hi", 1)]
    u = decision.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (100, 4, 104)
    assert (u.input_tokens_details.cached_tokens,
            u.input_tokens_details.cache_write_tokens) == (40, 30)
    assert u.output_tokens_details.reasoning_tokens == 0
    assert openai is not None


def test_legacy_schema_bodies_are_recognised_only_when_unambiguous():
    assert D.is_legacy_schema_body({"schema": {}, "context": "x"})
    assert not D.is_legacy_schema_body({"schema": {}, "questions": []})
    assert not D.is_legacy_schema_body({"schema": {}, "input": "x"})
    assert not D.is_legacy_schema_body({"context": "x"})
    assert not D.is_legacy_schema_body([])
