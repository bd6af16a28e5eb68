"""Reasoning models (issue 27): a Qwen3-style thinking switch. Decisions render with thinking
off; generation maps reasoning_effort / chat_template_kwargs onto the switch and returns the
reasoning apart. A tiny random-weight Qwen3 with SmolLM2's tokenizer and a template written
here (Qwen3's switch) proves the plumbing; a grammar makes it write a think block."""

import pytest

from onepass.generate.reasoning import (
    ReasoningSplitter,
    decision_kwargs,
    has_thinking_switch,
    reasoning_token_count,
    split_reasoning,
    thinking_on,
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
    from onepass.contract import ContractError

    engine = tiny_engine(tiny, QWEN3_TEMPLATE)
    with pytest.raises(ContractError) as info:
        engine.answer({**REQUEST, "chat_template_kwargs": {"enable_thinking": True}})
    assert info.value.field == "chat_template_kwargs.enable_thinking"
