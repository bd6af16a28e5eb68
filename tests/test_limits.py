"""The one place every length, count and vocabulary limit is worded and given its status."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from onepass import limits
from onepass.contract import ContractError
from onepass.server.errors import STATUS_BY_KIND

SRC = Path(__file__).resolve().parents[1] / "src" / "onepass"


def test_a_prompt_over_max_input_tokens_is_a_413_naming_field_count_and_setting():
    with pytest.raises(ContractError) as info:
        limits.check_tokens("messages", 9000, max_input_tokens=8192, context=32768)
    err = info.value
    assert err.field == "messages" and STATUS_BY_KIND[err.kind] == 413
    assert err.message == ("the prompt has 9000 tokens, over the limit of 8192 "
                           "(max_input_tokens); nothing is truncated: shorten the input or "
                           "raise the limit")


def test_a_prompt_over_the_context_is_the_same_kind_with_its_own_setting():
    with pytest.raises(ContractError) as info:
        limits.check_tokens("input[2]", 3000, max_input_tokens=8192, context=2048,
                            what="input[2]")
    err = info.value
    assert STATUS_BY_KIND[err.kind] == 413
    assert err.message.startswith("input[2] has 3000 tokens, over the limit of 2048 "
                                  "(the model's context); nothing is truncated")


@pytest.mark.parametrize("tokens", [0, 1, 2048])
def test_a_prompt_at_or_under_both_limits_passes(tokens):
    limits.check_tokens("prompt", tokens, max_input_tokens=2048, context=2048)


def test_a_lower_bound_reads_as_text():
    err = limits.too_long("state", "at least 9001", 8192, when=" before any answer")
    assert "has at least 9001 tokens before any answer, over the limit of 8192" in err.message


def test_too_many_is_a_413_with_the_setting_and_the_advice():
    err = limits.too_many("schema", 9, "fields", 8, "max_questions", advice="split the schema")
    assert STATUS_BY_KIND[err.kind] == 413 and err.field == "schema"
    assert err.message == ("9 fields is over the limit of 8 per request (max_questions); "
                           "split the schema")


@pytest.mark.parametrize("ids, bad", [([0, 5, 99], None), ([3, 100, 7], 100), ([-1], -1),
                                      ([4, 100, 200], 100)])
def test_the_first_token_id_outside_the_vocabulary_is_named(ids, bad):
    if bad is None:
        limits.check_vocabulary("input_ids", ids, 100)
        return
    with pytest.raises(ContractError) as info:
        limits.check_vocabulary("input_ids", ids, 100)
    assert info.value.field == "input_ids" and STATUS_BY_KIND[info.value.kind] == 400
    assert info.value.message == f"token id {bad} is outside the vocabulary (ids 0..99)"


def test_no_module_words_a_token_limit_or_a_vocabulary_check_of_its_own():
    """The sentences live in limits.py only: a route that writes its own again fails here.
    (Training data is not a request: its own refusal names the dataset line.)"""
    own = ("tokens, over the", "outside the vocabulary", "nothing is truncated",
           "no room for an output", "output tokens do not fit")
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "limits.py" or path.parent.name in ("train", "commands"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and any(s in node.value for s in own) and not _docstring_like(node.value)):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"limits worded outside onepass/limits.py: {found}"


def test_the_output_room_refuses_a_full_context_and_a_bound_that_does_not_fit():
    assert limits.output_room(100, 2048) == 1948
    assert limits.output_room(100, 2048, 1948) == 1948
    with pytest.raises(ContractError) as full:
        limits.output_room(2048, 2048, prompt_field="prompt")
    assert full.value.field == "prompt" and STATUS_BY_KIND[full.value.kind] == 400
    with pytest.raises(ContractError) as over:
        limits.output_room(100, 2048, 1949, field="max_output_tokens")
    assert over.value.field == "max_output_tokens" and "so at most 1948" in over.value.message


def test_a_body_over_max_body_bytes_is_a_413():
    err = limits.body_too_large(1024, "decoded request body")
    assert STATUS_BY_KIND[err.kind] == 413
    assert err.message.startswith("the decoded request body is over the limit of 1024 bytes")


def _docstring_like(text: str) -> bool:
    return len(text) > 200 or "\n" in text
