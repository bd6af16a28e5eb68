"""Reasoning models (issue 27): a Qwen3-style thinking switch. Decisions render with thinking
off; generation maps reasoning_effort / chat_template_kwargs onto the switch and returns the
reasoning apart. A tiny random-weight Qwen3 with SmolLM2's tokenizer and a template written
here (Qwen3's switch) proves the plumbing; a grammar makes it write a think block."""

import json

import pytest

from onepass.contract import ContractError
from onepass.generate.reasoning import (
    ReasoningSplitter,
    decision_kwargs,
    generation_kwargs,
    has_thinking_switch,
    reasoning_token_count,
    split_reasoning,
    thinking_on,
    thinking_prompt,
)

# ChatML with Qwen3's switch after the assistant header
QWEN3_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
PLAIN_TEMPLATE = QWEN3_TEMPLATE.split("{%- if enable_thinking")[0] + "{%- endif %}"
EMPTY_THINK = "<think>\n\n</think>\n\n"
REQUEST = {"state": "The parcel arrived crushed; refund please.",
           "questions": {"n": {"type": "noul", "instructions": "Wants money back."}}}


# --------------------------------------------------------------------------- pure splitting


def stream_split(text: str, thinking: bool, step: int = 1) -> tuple[str, str, bool]:
    splitter = ReasoningSplitter(thinking)
    parts = []
    for i in range(0, len(text), step):
        parts += splitter.feed(text[i:i + step])
    parts += splitter.flush()
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    content = "".join(t for k, t in parts if k == "content")
    return reasoning, content, splitter.reasoned


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), [
    ("<think>abc</think>hello", False, "abc", "hello"),
    ("<think>\nplan</think>\n\nAnswer", False, "\nplan", "Answer"),
    ("plan</think>done", True, "plan", "done"),           # prompt opened the block
    ("<think>plan</think>done", True, "plan", "done"),
    ("just text", False, None, "just text"),
    ("a <think>b</think> c", False, None, "a <think>b</think> c"),  # not at the start
    ("<think>never closed", False, "never closed", ""),
    ("<th", False, None, "<th"),                          # looked like a tag, was not
    ("<think></think>x", False, "", "x"),
    ("a < b </thin", True, "a < b </thin", ""),
])
def test_split_whole_and_streamed_char_by_char(text, thinking, reasoning, content):
    assert split_reasoning(text, thinking) == (reasoning, content)
    for step in (1, 2, 3, 7):
        got_reasoning, got_content, reasoned = stream_split(text, thinking, step)
        assert (got_reasoning if reasoned else None, got_content) == (reasoning, content), step


def test_splitter_emits_reasoning_before_the_end_tag_arrives():
    splitter = ReasoningSplitter(False)
    assert splitter.feed("<think>abc</th") == [("reasoning", "abc")]  # "</th" held back
    assert splitter.feed("ink>he") == [("content", "he")]
    assert splitter.feed("llo") == [("content", "llo")]


def test_reasoning_token_count_finds_the_end_tag_token():
    pieces = ["<think>", "a", "b", "</", "think>", "hi", "!"]

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    ids = list(range(len(pieces)))
    assert reasoning_token_count(ids, decode, False) == 5
    assert reasoning_token_count([5, 6], decode, False) == 0
    assert reasoning_token_count([0, 1, 2], decode, False) == 3  # never closed: all
    assert reasoning_token_count([], decode, True) == 0


def test_switch_detection_and_effort_mapping():
    assert has_thinking_switch(QWEN3_TEMPLATE) and not has_thinking_switch(PLAIN_TEMPLATE)
    assert not has_thinking_switch(None)
    assert decision_kwargs(QWEN3_TEMPLATE) == {"enable_thinking": False}
    assert decision_kwargs(QWEN3_TEMPLATE, (("x", 1),)) == {"enable_thinking": False, "x": 1}
    assert decision_kwargs(PLAIN_TEMPLATE) == {}
    assert [thinking_on(e) for e in (None, "none", "minimal", "low", "high")] == [
        None, False, False, True, True]


def test_generation_kwargs_map_effort_and_refuse_by_name():
    assert generation_kwargs(QWEN3_TEMPLATE, (), "high", "reasoning_effort",
                             accepts_kwargs=True) == {"enable_thinking": True}
    assert generation_kwargs(QWEN3_TEMPLATE, (("x", 1),), "minimal", "reasoning.effort",
                             accepts_kwargs=True) == {"enable_thinking": False, "x": 1}
    assert generation_kwargs(PLAIN_TEMPLATE, (), "none", "reasoning_effort",
                             accepts_kwargs=False) == {}
    for template, kwargs, effort, accepts, field, words in [
        (PLAIN_TEMPLATE, (), "low", True, "reasoning_effort", "no thinking switch"),
        (QWEN3_TEMPLATE, (), "low", False, "reasoning_effort", "backend"),
        (PLAIN_TEMPLATE, (("x", 1),), None, False, "chat_template_kwargs", "no chat template"),
        (QWEN3_TEMPLATE, (("enable_thinking", True),), "none", True, "reasoning_effort",
         "send one of them"),
    ]:
        with pytest.raises(ContractError) as info:
            generation_kwargs(template, kwargs, effort, "reasoning_effort",
                              accepts_kwargs=accepts)
        assert info.value.field == field and words in info.value.message


def test_thinking_prompt_from_the_switch_or_an_opened_block():
    assert thinking_prompt({"enable_thinking": True}, "assistant\n")
    assert thinking_prompt({}, "<|im_start|>assistant\n<think>\n")
    assert not thinking_prompt({}, "<|im_start|>assistant\n")
    assert not thinking_prompt({"enable_thinking": False}, "<think>\n\n</think>\n\n")


# --------------------------------------------------------------------------- tiny Qwen3


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer random-weight Qwen3 and SmolLM2's tokenizer (vocabulary and specials)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    from onepass.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve().path)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return model, tokenizer


def tiny_engine(tiny, template: str):
    import copy

    from onepass.backends.torch import TorchBackend
    from onepass.engine import DecisionEngine

    model, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return DecisionEngine(TorchBackend(model, tokenizer, name="tiny-qwen3"))


def decision_prompt(engine) -> str:
    from onepass.contract import parse_request

    _, prefix, suffixes = engine.prompt_tokens(parse_request(REQUEST))
    return engine.backend.decode(prefix + suffixes[0])


def test_decisions_render_with_thinking_off(tiny):
    engine = tiny_engine(tiny, QWEN3_TEMPLATE)
    assert engine.format.tail.endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert decision_prompt(engine).endswith(EMPTY_THINK)
    answer = engine.answer(REQUEST)["answers"]["n"]
    assert 0.0 <= answer["noul"] <= 1.0
    # a request's own template kwargs keep thinking off too
    templated = engine.answer({**REQUEST, "chat_template_kwargs": {"x": "y"}})
    assert templated["answers"]["n"]["noul"] == pytest.approx(answer["noul"], abs=1e-4)
    assert engine._templated((("x", "y"),)).format == engine.format


def test_a_template_without_the_switch_renders_unchanged(tiny):
    engine = tiny_engine(tiny, PLAIN_TEMPLATE)
    assert engine.format.tail.endswith("<|im_start|>assistant\n")
    assert "<think>" not in decision_prompt(engine)
    messages = [{"role": "user", "content": "hi"}]
    assert engine.backend.render_chat(messages) == "<|im_start|>user\nhi<|im_end|>\n" \
        "<|im_start|>assistant\n"


def test_thinking_on_for_a_decision_is_refused(tiny):
    engine = tiny_engine(tiny, QWEN3_TEMPLATE)
    with pytest.raises(ContractError) as info:
        engine.answer({**REQUEST, "chat_template_kwargs": {"enable_thinking": True}})
    assert info.value.field == "chat_template_kwargs.enable_thinking"


# --------------------------------------------------------------------------- served


GRAMMAR = 'start: "<think>" "abc" "</think>" "hello"'
ASK = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def http(tiny):
    """The tiny Qwen3 (switch template) and the same model without a switch, in-process."""
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    with TestClient(create_app(tiny_engine(tiny, QWEN3_TEMPLATE), ServerSettings())) as c:
        yield c


def frames(http, path, body):
    with http.stream("POST", path, json={**body, "stream": True}) as s:
        assert s.status_code == 200
        return [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]


def test_chat_returns_the_think_block_as_reasoning_content(http):
    body = {"messages": ASK, "grammar": GRAMMAR, "max_tokens": 40, "temperature": 0,
            "reasoning_effort": "high"}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    message, usage = r.json()["choices"][0]["message"], r.json()["usage"]
    assert (message["reasoning_content"], message["content"]) == ("abc", "hello")
    reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
    assert 0 < reasoning_tokens < usage["completion_tokens"]
    chunks = frames(http, "/v1/chat/completions",
                    {**body, "stream_options": {"include_usage": True}})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "abc"
    assert "".join(d.get("content", "") for d in deltas) == "hello"
    last_reasoning = max(i for i, d in enumerate(deltas) if "reasoning_content" in d)
    assert all(not d.get("content") for d in deltas[:last_reasoning])  # reasoning first
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == \
        reasoning_tokens


def test_responses_return_a_reasoning_item(http):
    body = {"input": "Say hello.", "max_output_tokens": 40, "temperature": 0,
            "reasoning": {"effort": "medium"}, "grammar": GRAMMAR}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [item["type"] for item in out["output"]] == ["reasoning", "message"]
    item = out["output"][0]
    assert item["summary"] == [] and item["id"].startswith("rs_")
    assert item["content"] == [{"type": "reasoning_text", "text": "abc"}]
    assert out["output"][1]["content"][0]["text"] == "hello"
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert out["reasoning"] == {"effort": "medium", "summary": None}
    events = frames(http, "/v1/responses", body)
    kinds = [e["type"] for e in events]
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.reasoning_text.delta") == "abc"
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.output_text.delta") == "hello"
    assert kinds.index("response.reasoning_text.done") < kinds.index(
        "response.output_text.delta")
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [(e["output_index"], e["item"]["type"]) for e in done] == [
        (0, "reasoning"), (1, "message")]
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["id"] == done[0]["item"]["id"]
    assert final["output"][0]["content"][0]["text"] == "abc"


def test_effort_maps_onto_the_switch_and_conflicts_are_refused(http):
    def prompt_tokens(**extra):
        r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1,
                                                     "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    on = prompt_tokens(reasoning_effort="low")
    off = prompt_tokens(reasoning_effort="none")
    assert off > on  # thinking off: the empty think block is in the prompt
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == off
    assert prompt_tokens(reasoning_effort="minimal") == off
    r = http.post("/v1/chat/completions", json={
        "messages": ASK, "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


def test_a_model_without_a_switch_refuses_effort_by_name(tiny):
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    with TestClient(create_app(tiny_engine(tiny, PLAIN_TEMPLATE), ServerSettings())) as c:
        for path, body, field in [
            ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "low"},
             "reasoning_effort"),
            ("/v1/responses", {"input": "hi", "reasoning": {"effort": "high"}},
             "reasoning.effort"),
        ]:
            r = c.post(path, json={**body, "max_tokens" if "messages" in body
                                   else "max_output_tokens": 2})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == field
            assert "not supported" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2,
                                                  "reasoning_effort": "none"})
        assert r.status_code == 200, r.text
        assert "reasoning_content" not in r.json()["choices"][0]["message"]


def test_a_template_that_opens_the_block_itself(tiny):
    """DeepSeek-R1-style: the prompt ends in ``<think>``, the reply has only the end tag."""
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    opened = PLAIN_TEMPLATE.replace("'<|im_start|>assistant\\n'",
                                    "'<|im_start|>assistant\\n<think>\\n'")
    assert opened != PLAIN_TEMPLATE
    with TestClient(create_app(tiny_engine(tiny, opened), ServerSettings())) as c:
        r = c.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": 40, "temperature": 0,
            "grammar": 'start: "abc" "</think>" "hello"'})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("abc", "hello")
