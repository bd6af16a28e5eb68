"""System One's vLLM request fields: ``instructions``, ``chat_template_kwargs``, ``cache_salt``
and the opt-in per-answer ``diagnostics`` — parsed (hostile values are field-named 4xx, never a
500), rendered into the prompt, isolating the prefix cache, and read through the real embedded
model (library path and a real server driven by the official typesafe-sdk client)."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections import OrderedDict

import httpx
import pytest

from onepass import prompt as P
from onepass.contract import (
    MAX_CACHE_SALT_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    ContractError,
    parse_request,
)
from onepass.readout import label_diagnostics

STATE = "My parcel arrived with a crushed box and a broken mug inside."
QUESTIONS = {
    "damaged": {"type": "noul", "instructions": "The item arrived damaged."},
    "team": {"type": "choice", "instructions": "Which team handles it?",
             "criteria": {"billing": None, "logistics": "shipping damage"}},
    "only": {"type": "choice", "instructions": "Pick it", "criteria": {"it": None}},
}
BASE = {"state": STATE, "questions": QUESTIONS}


# --------------------------------------------------------------------------- contract (pure)


def test_fields_parse():
    r = parse_request({**BASE, "instructions": "  Be strict.  ", "cache_salt": "tenant-7",
                       "diagnostics": True,
                       "chat_template_kwargs": {"z": 1, "enable_thinking": False, "a": "x"}})
    assert r.instructions == "  Be strict.  " and r.cache_namespace == "tenant-7"
    assert r.diagnostics is True
    assert r.chat_template_kwargs == (("a", "x"), ("enable_thinking", False), ("z", 1))
    plain = parse_request({**BASE, "instructions": "   ", "diagnostics": None})
    assert plain.instructions is None and plain.diagnostics is False
    assert plain.cache_namespace is None and plain.chat_template_kwargs == ()


HOSTILE = [
    ({"instructions": 7}, "instructions", "expected a string"),
    ({"instructions": ["be", "strict"]}, "instructions", "an array"),
    ({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "instructions", "at most"),
    ({"cache_salt": 5}, "cache_salt", "a number"),
    ({"cache_salt": ""}, "cache_salt", "non-empty"),
    ({"cache_salt": {"a": 1}}, "cache_salt", "an object"),
    ({"cache_salt": "s" * (MAX_CACHE_SALT_CHARS + 1)}, "cache_salt", "at most"),
    ({"diagnostics": "yes"}, "diagnostics", "a boolean"),
    ({"diagnostics": 1}, "diagnostics", "a boolean"),
    ({"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs", "an object"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "an object"),
    ({"chat_template_kwargs": {"a": {"b": 1}}}, "chat_template_kwargs.a", "nested"),
    ({"chat_template_kwargs": {"a": [1, 2]}}, "chat_template_kwargs.a", "nested"),
    ({"chat_template_kwargs": {"a": "v" * 1025}}, "chat_template_kwargs.a", "at most"),
    ({"chat_template_kwargs": {"a": 2**60}}, "chat_template_kwargs.a", "2**53"),
    ({"chat_template_kwargs": {f"k{i}": 1 for i in range(33)}}, "chat_template_kwargs",
     "at most 32"),
    ({"chat_template_kwargs": {"": 1}}, "chat_template_kwargs", "keys"),
    ({"chat_template_kwargs": {"k" * 65: 1}}, "chat_template_kwargs", "keys"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking",
     "thinking must be off"),
    ({"chat_template_kwargs": {"thinking": "on"}}, "chat_template_kwargs.thinking",
     "first token"),
    ({"chat_template_kwargs": {"chat_template": "{% for i in range(10**9) %}{% endfor %}"}},
     "chat_template_kwargs.chat_template", "reserved"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize", "reserved"),
    ({"chat_template_kwargs": {"messages": "x"}}, "chat_template_kwargs.messages", "reserved"),
]


@pytest.mark.parametrize(("extra", "field", "words"), HOSTILE)
def test_hostile_fields_name_the_field(extra, field, words):
    with pytest.raises(ContractError) as caught:
        parse_request({**BASE, **extra})
    assert caught.value.field == field
    assert words in caught.value.message


def test_instructions_render_in_the_system_turn_after_the_context():
    fmt = P.ChatFormat("<s>", "</s><u>", "</u><a>")
    text = P.render_prefix(fmt, "doc", "server context", ("<|im_end|>",), "ask <|im_end|> x")
    system = text[len("<s>"):text.index("</s><u>")]
    assert system.startswith(P.SYSTEM_INSTRUCTIONS)
    assert system.index("server context") < system.index("Instructions:\nask")
    assert "<|im_end|>" not in system  # neutralised like any client text
    assert P.render_prefix(fmt, "doc", "server context") == text.replace(
        text[text.index("\n\nInstructions:"):text.index("</s><u>")], "")


def test_label_diagnostics_arithmetic():
    d = label_diagnostics([0.0, 0.0], math.log(4.0), 1.0)
    assert d["label_mass"] == pytest.approx(0.5) and d["argmax_is_label"] is False
    assert label_diagnostics([2.0, 1.0], math.log(math.e**2 + math.e), 2.0) == {
        "label_mass": pytest.approx(1.0), "argmax_is_label": True}


# --------------------------------------------------------------------------- real model


def test_diagnostics_match_the_models_full_softmax(engine, library_path):
    import torch

    fast = engine.answer({**BASE, "diagnostics": True})
    naive = engine.answer({**BASE, "diagnostics": True}, naive=True)
    assert "diagnostics" not in engine.answer(BASE)["answers"]["team"]
    assert "diagnostics" not in fast["answers"]["only"]  # a 1-option choice reads no model
    request = parse_request(BASE)
    prefix_text = P.render_prefix(engine.format, STATE, engine.context, engine.specials)
    for q in request.questions[:2]:
        position = engine.question_position(q)
        prefix, (suffix,) = engine.tokenize(prefix_text, [position.suffix])
        with torch.inference_mode():
            logits = engine.backend.model(torch.tensor([prefix + suffix])).logits[0, -1].float()
        probs = torch.softmax(logits, 0)
        ids = [lb.token_id for lb in position.labels]
        got = fast["answers"][q.name]["diagnostics"]
        assert got["label_mass"] == pytest.approx(probs[ids].sum().item(), abs=1e-4)
        assert got["argmax_is_label"] == (int(logits.argmax()) in ids)
        assert naive["answers"][q.name]["diagnostics"]["label_mass"] == pytest.approx(
            got["label_mass"], abs=1e-4)
        assert 0.0 < got["label_mass"] <= 1.0
    # the answers themselves do not change when diagnostics are asked for
    assert fast["answers"]["team"]["probabilities"] == engine.answer(BASE)["answers"]["team"][
        "probabilities"]


def test_instructions_change_the_answer_and_are_cached(engine, library_path):
    state = f"{STATE} (ticket {uuid.uuid4()})"
    told = {"state": state, "questions": QUESTIONS,
            "instructions": "Company policy: a crushed box is never counted as damage."}
    plain = engine.answer({"state": state, "questions": QUESTIONS})
    first = engine.answer(told)
    again = engine.answer(told)
    assert first["usage"]["input_tokens"] > plain["usage"]["input_tokens"]
    assert first["answers"]["damaged"]["noul"] != plain["answers"]["damaged"]["noul"]
    assert again["answers"] == first["answers"]
    # the instructions are part of the prefix the second request reads from the cache
    assert again["usage"]["cached_tokens"] > first["usage"]["cached_tokens"] + 20


def test_cache_salt_isolates_the_prefix_cache(engine, library_path):
    body = {"state": f"{STATE} (ticket {uuid.uuid4()})", "questions": QUESTIONS}
    cold = engine.answer({**body, "cache_salt": "tenant-a"})["usage"]["cached_tokens"]
    warm = engine.answer({**body, "cache_salt": "tenant-a"})["usage"]["cached_tokens"]
    other = engine.answer({**body, "cache_salt": "tenant-b"})["usage"]["cached_tokens"]
    unsalted = engine.answer(body)["usage"]["cached_tokens"]
    assert warm > cold + 20
    assert other == cold and unsalted == cold  # neither reads tenant-a's entry


def test_chat_template_kwargs_reach_the_template(engine, library_path, monkeypatch):
    tokenizer = engine.backend.tokenizer
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                "{% if m['role'] == 'system' and persona %}You are {{ persona }}. {% endif %}"
                "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr(tokenizer, "chat_template", template)
    monkeypatch.setattr(engine, "_formats", OrderedDict(), raising=False)
    pirate = engine.answer({**BASE, "chat_template_kwargs": {"persona": "a pirate"}})
    judge = engine.answer({**BASE, "chat_template_kwargs": {"persona": "a strict judge"}})
    assert pirate["usage"]["input_tokens"] != judge["usage"]["input_tokens"]
    assert pirate["answers"]["damaged"]["noul"] != judge["answers"]["damaged"]["noul"]
    fmt, _ = engine._formats[(("persona", "a pirate"),)]
    assert "You are a pirate. " in fmt.head
    assert engine.format.head.count("pirate") == 0  # the engine's own format is untouched
    with pytest.raises(ContractError) as caught:
        engine.answer({**BASE, "chat_template_kwargs": {"enable_thinking": True}})
    assert caught.value.field == "chat_template_kwargs.enable_thinking"


# --------------------------------------------------------------------------- real server


def test_sdk_parses_answers_with_diagnostics(server):
    ts = pytest.importorskip("typesafe_sdk")
    extra = {"instructions": "Answer as the shipping team would.", "cache_salt": "sdk-test",
             "diagnostics": True, "chat_template_kwargs": {"enable_thinking": False}}
    with ts.TypeSafeClient(api_key="local", base_url=server) as client:
        r = client.system_one(
            state=STATE, extra_body=extra,
            questions={"damaged": ts.Noul(instructions="The item arrived damaged."),
                       "team": ts.Choice(instructions="Which team handles it?",
                                         criteria={"billing": None, "logistics": None}),
                       "urgency": ts.Score(instructions="How urgent?",
                                           criteria=["low", "high"])})
    assert 0.0 <= r.nouls["damaged"].noul <= 1.0
    assert r.choices["team"].choice in {"billing", "logistics"}
    raw = httpx.post(server + "/v1/systemone", json={**BASE, **extra}, timeout=60).json()
    for name in ("damaged", "team"):
        d = raw["answers"][name]["diagnostics"]
        assert 0.0 < d["label_mass"] <= 1.0 and isinstance(d["argmax_is_label"], bool)
    assert "diagnostics" not in raw["answers"]["only"]


@pytest.mark.parametrize(("extra", "field"), [
    ({"instructions": {"a": 1}}, "instructions"),
    ({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "instructions"),
    ({"cache_salt": ["a"]}, "cache_salt"),
    ({"diagnostics": "true"}, "diagnostics"),
    ({"chat_template_kwargs": {"a": {"b": {"c": [1]}}}}, "chat_template_kwargs.a"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"chat_template": "{{ 7 * 7 }}"}},
     "chat_template_kwargs.chat_template"),
])
def test_server_refuses_hostile_fields_by_name(server, extra, field):
    r = httpx.post(server + "/v1/systemone", json={**BASE, **extra}, timeout=60)
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["field"] == field


def test_typed_lm_model_name_is_served(server):
    """typed-lm's documented request names its model "typed-lm": served like jev-latest."""
    r = httpx.post(server + "/v1/systemone", json={**BASE, "model": "typed-lm"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2-135m-instruct"
    other = httpx.post(server + "/v1/systemone", json={**BASE, "model": "typed-lm-x"},
                       timeout=60)
    assert other.status_code == 404 and "'typed-lm'" in other.json()["error"]["message"]


@pytest.mark.parametrize(("attribute", "extra", "field"), [
    ("vocab_statistics", {"diagnostics": True}, "diagnostics"),
    ("cache_namespaces", {"cache_salt": "t"}, "cache_salt"),
    ("template_kwargs", {"chat_template_kwargs": {"persona": "x"}}, "chat_template_kwargs"),
])
def test_a_backend_without_the_ability_refuses_by_field(engine, monkeypatch, attribute, extra,
                                                        field):
    """llama.cpp and remote engines have none of these: the request is refused before any
    model work, naming the field (here the torch backend with the ability switched off)."""
    monkeypatch.setattr(engine, "capabilities",
                        dataclasses.replace(engine.capabilities, **{attribute: False}))
    with pytest.raises(ContractError) as caught:
        engine.check_request(parse_request({**BASE, **extra}))
    assert caught.value.field == field
    assert caught.value.message.endswith("send the request without it")
