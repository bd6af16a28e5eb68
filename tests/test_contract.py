import pytest

from onepass.contract import ContractError, parse_request, resolves_to


def req(**questions):
    return {"model": "jev-latest", "state": "s", "questions": questions}


def errors(raw):
    with pytest.raises(ContractError) as info:
        parse_request(raw)
    return info.value


def test_mixed_request_parses_in_declared_order():
    r = parse_request(
        req(
            a={"type": "noul", "instructions": "It is."},
            b={"type": "choice", "instructions": "pick", "criteria": {"x": None, "y": "why"}},
            c={"type": "score", "instructions": "rate", "criteria": ["low", "high"]},
            d={"type": "noul", "criteria": {"true": "yes"}},
        )
    )
    assert [q.name for q in r.questions] == ["a", "b", "c", "d"]
    assert r.questions[1].options == ("x", "y")
    assert r.questions[1].descriptions == (None, "why")
    assert r.questions[2].options == ("0", "1")
    assert r.questions[2].descriptions == ("low", "high")
    assert r.questions[3].options == ("true", "false")
    assert r.questions[3].descriptions == ("yes", None)


def test_json_state_and_json_instructions_are_accepted():
    r = parse_request(
        {"state": {"order": [1, 2]}, "questions": {
            "a": {"type": "choice", "instructions": {"ask": "which"}, "criteria": {"x": [1]}}}}
    )
    assert r.state == {"order": [1, 2]}
    assert r.model is None  # optional: means the served model


def test_unknown_top_level_keys_are_ignored_and_document_aliases_state():
    r = parse_request({"document": "d", "questions": {"a": {"type": "noul", "instructions": "x"}},
                       "latency_budget": 3})
    assert r.state == "d" and [q.name for q in r.questions] == ["a"]


def test_trivial_questions():
    r = parse_request(req(
        one={"type": "choice", "instructions": "x", "criteria": {"only": None}},
        lvl={"type": "score", "instructions": "x", "criteria": ["single"]},
    ))
    assert all(q.is_trivial for q in r.questions)


def test_score_scalar_levels_are_stringified_for_the_legend():
    r = parse_request(req(s={"type": "score", "instructions": "x", "criteria": [1, 2.5, True]}))
    assert r.questions[0].descriptions == ("1", "2.5", "true")


@pytest.mark.parametrize(
    "raw,field,words",
    [
        ([1, 2], "body", "JSON object"),
        ({"questions": {"a": {"type": "noul", "instructions": "x"}}}, "state", "required"),
        ({"state": None, "questions": {"a": {"type": "noul", "instructions": "x"}}}, "state",
         "null"),
        ({"state": "s"}, "questions", "nothing"),
        ({"state": "s", "questions": {}}, "questions", "at least one"),
        ({"state": "s", "questions": []}, "questions", "an array"),
        ({"state": "s", "model": 3, "questions": {"a": {"type": "noul", "instructions": "x"}}},
         "model", "non-empty string"),
        (req(a="noul"), "questions.a", "question object"),
        (req(a={"type": "poll", "instructions": "x"}), "questions.a.type", "'poll'"),
        (req(a={"instructions": "x"}), "questions.a.type", "'noul', 'choice' or 'score'"),
        (req(a={"type": "box", "instructions": "x"}), "questions.a.type", "vision"),
        (req(a={"type": "noul"}), "questions.a", "instructions"),
        (req(a={"type": "noul", "criteria": {"yes": None, "no": None}}), "questions.a",
         "non-null criterion"),
        (req(a={"type": "noul", "instructions": "x", "criteria": {"yes": "a", "false": "b"}}),
         "questions.a.criteria", "not mixed"),
        (req(a={"type": "noul", "instructions": "x", "criteria": ["yes"]}),
         "questions.a.criteria", "an array"),
        (req(a={"type": "noul", "instructions": 5}), "questions.a.instructions", "a number"),
        (req(a={"type": "noul", "instructions": "x", "extra": 1}), "questions.a.extra",
         "unknown field"),
        (req(a={"type": "choice", "instructions": "x"}), "questions.a.criteria", "nothing"),
        (req(a={"type": "choice", "instructions": "x", "criteria": {}}), "questions.a.criteria",
         "1 to 255"),
        (req(a={"type": "choice", "instructions": "x",
                "criteria": {str(i): None for i in range(256)}}), "questions.a.criteria",
         "got 256"),
        (req(a={"type": "choice", "instructions": "x", "criteria": {"a": 1}}),
         "questions.a.criteria.a", "a number"),
        (req(a={"type": "choice", "criteria": {"a": None}}), "questions.a.instructions",
         "needs 'instructions'"),
        (req(a={"type": "score", "instructions": "x", "criteria": []}), "questions.a.criteria",
         "1 to 10"),
        (req(a={"type": "score", "instructions": "x", "criteria": [str(i) for i in range(11)]}),
         "questions.a.criteria", "got 11"),
        (req(a={"type": "score", "instructions": "x", "criteria": {"a": 1}}),
         "questions.a.criteria", "an object"),
        (req(a={"type": "score", "instructions": "x", "criteria": ["a", None]}),
         "questions.a.criteria[1]", "null"),
        (req(a={"type": "score", "instructions": "x", "criteria": ["a", float("nan")]}),
         "questions.a.criteria[1]", "NaN"),
        ({"state": "s", "temperature": "hot", "questions": {"a": {"type": "noul",
          "instructions": "x"}}}, "temperature", "a string"),
        ({"state": "s", "temperature": 0, "questions": {"a": {"type": "noul",
          "instructions": "x"}}}, "temperature", "greater than 0"),
        # a JSON integer past a double: float() overflows, the answer is still a 400
        ({"state": "s", "temperature": 10**400, "questions": {"a": {"type": "noul",
          "instructions": "x"}}}, "temperature", "finite number"),
        ({"state": "s", "assets": {"i": {"type": "image"}}, "questions": {"a": {"type": "noul",
          "instructions": "x"}}}, "assets", "vision"),
        ({"state": {"x": float("inf")}, "questions": {"a": {"type": "noul",
          "instructions": "x"}}}, "state.x", "finite"),
    ],
)
def test_contract_violations_name_the_field(raw, field, words):
    err = errors(raw)
    assert err.field == field
    assert words in err.message


def test_nan_strings_are_ordinary_strings_in_content():
    # the SDK sends NaN as the string "NaN": inside state or instructions it is just text
    r = parse_request({"state": {"x": "NaN"}, "questions": {"a": {"type": "noul",
                       "instructions": "Infinity"}}})
    assert r.state == {"x": "NaN"}


def test_model_aliases():
    assert resolves_to(None, "smollm2")
    assert resolves_to("jev-latest", "smollm2")
    assert resolves_to("jev-1.13.0", "smollm2")
    assert resolves_to("smollm2", "smollm2")
    assert resolves_to("typed-lm", "smollm2")  # typed-lm's documented requests name it so
    assert not resolves_to("typed-lm-2", "smollm2")
    assert not resolves_to("gpt-4", "smollm2")
