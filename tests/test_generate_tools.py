"""Function tools (generate/tools.py): parsing each family's call format, the portable
instruction and message rendering, the forced-call grammar on the real vocabulary."""

from __future__ import annotations

import json

import pytest

from onepass.contract import ContractError
from onepass.generate import tools as T

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER,
                                                "strict": True}},
              {"type": "function", "function": {"name": "time", "description": "Clock"}}]


def spec(choice=None, parallel=None) -> T.ToolSpec:
    return T.parse_tool_request(CHAT_TOOLS, choice, parallel)


def test_request_shapes_and_defaults():
    s = spec()
    assert s.choice == "auto" and s.parallel and s.active and not s.forced
    assert [f.name for f in s.functions] == ["weather", "time"]
    assert s.function("time").parameters == {"type": "object", "properties": {}}
    named = spec({"type": "function", "function": {"name": "time"}})
    assert named.forced and named.named == "time"
    assert named.choice_wire("responses") == {"type": "function", "name": "time"}
    assert not spec("none").active
    assert T.parse_tool_request(None, None, None) is None
    responses = T.parse_tool_request([{"type": "function", "name": "f", "strict": False}],
                                     {"type": "function", "name": "f"}, False,
                                     dialect="responses")
    assert responses.named == "f" and not responses.parallel


def test_hermes_calls_parse_with_content_and_ids():
    text = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n' \
           '</tool_call>\n<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>'
    content, calls = T.parse_calls(text, spec())
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("weather", '{"city":"Paris"}'),
                                                      ("time", "{}")]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert T.parse_calls("no calls here {\"name\": 1}", spec()) == (
        "no calls here {\"name\": 1}", [])


def test_mistral_and_llama_formats():
    _, calls = T.parse_calls('[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]',
                             spec())
    assert calls[0].arguments == '{"city":"Oslo"}'
    _, calls = T.parse_calls('[TOOL_CALLS]weather[ARGS]{"city": "Rome"}', spec())
    assert calls[0].name == "weather" and json.loads(calls[0].arguments) == {"city": "Rome"}
    _, calls = T.parse_calls('<|python_tag|>{"name": "time", "parameters": {}}', spec())
    assert calls[0].name == "time"
    bare = '{"name": "weather", "parameters": {"city": "Lima"}}'
    assert T.parse_calls(bare, spec(), "hermes")[1] == []  # plain JSON is content elsewhere
    assert T.parse_calls(bare, spec(), "llama")[1][0].name == "weather"


@pytest.mark.parametrize(("text", "words"), [
    ("<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"X\"}}", "not closed"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown function 'rm'"),
    ('<tool_call>{"name": "weather", "arguments": [1]}</tool_call>', "not a JSON object"),
    ('<tool_call>{"name": "weather", "arguments": {"town": "X"}}</tool_call>',
     "parameters schema"),  # strict: validated
    ('<tool_call>{"arguments": {}}</tool_call>', "no function name"),
])
def test_malformed_completed_calls_are_refused(text, words):
    with pytest.raises(T.MalformedCall) as err:
        T.parse_calls(text, spec())
    assert words in str(err.value)


def test_parallel_false_refuses_two_calls_and_named_refuses_another_function():
    two = '<tool_call>{"name": "time", "arguments": {}}</tool_call>' * 2
    with pytest.raises(T.MalformedCall, match="parallel_tool_calls"):
        T.parse_calls(two, spec(parallel=False))
    with pytest.raises(T.MalformedCall, match="required 'weather'"):
        T.parse_calls('<tool_call>{"name": "time", "arguments": {}}</tool_call>',
                      spec({"type": "function", "function": {"name": "weather"}}))


def test_length_cut_withholds_calls():
    assert T.content_before_calls('Sure. <tool_call>{"name": "we') == "Sure."
    assert T.content_before_calls("plain text ") == "plain text "


def test_portable_messages_render_instruction_calls_and_results():
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "name": "weather", "arguments": '{"city":"Paris"}'},
            {"id": "b", "name": "weather", "arguments": '{"city":"Rome"}'}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "a"},
        {"role": "tool", "content": "rain", "tool_call_id": "b"},
    ]
    T.check_tool_turns(history)
    out = T.portable_messages(history, spec())
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "weather"' in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"].count("<tool_call>") == 2
    assert out[3]["content"] == ("<tool_response>\nsunny\n</tool_response>\n"
                                 "<tool_response>\nrain\n</tool_response>")
    assert set(out[3]) == {"role", "content"}
    assert T.portable_messages(history[1:2], None) == [history[1]]  # no tools: untouched
    with pytest.raises(ContractError) as err:
        T.check_tool_turns(history[:4] + [{"role": "user", "content": "?"}])
    assert err.value.field == "messages[4]" and "b have no result" in err.value.message


def test_template_detection_and_native_rendering(engine):
    qwen_like = (
        "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}"
        "{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{%- endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
        "{{ c.function | tojson }}\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
        "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert T.template_declares_tools(qwen_like) and T.native_format(qwen_like) == "hermes"
    assert not T.template_declares_tools(engine.backend.chat_template)  # SmolLM2
    assert T.native_format("{{ tools }}[TOOL_CALLS]") == "mistral"
    assert T.native_format("{{ tools }}<|python_tag|>") == "llama"
    messages = T.native_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "name": "weather", "arguments": '{"city":"Oslo"}'}]}])
    tok = engine.backend.tokenizer
    text = tok.apply_chat_template(messages, tools=[f.chat_tool() for f in spec().functions],
                                   chat_template=qwen_like, tokenize=False,
                                   add_generation_prompt=True)
    assert '"name": "weather"' in text and '{"name": "weather", "arguments": {"city": ' \
        '"Oslo"}}' in text and text.endswith("<|im_start|>assistant\n")


def test_forced_call_grammar_compiles_and_generates_valid_calls(engine):
    from onepass.generate.grammar import compile_grammar, tokenizer_info

    info = tokenizer_info(engine.backend)
    for choice, parallel in (("required", False), ({"type": "function",
                                                    "function": {"name": "weather"}}, True)):
        s = spec(choice, parallel)
        grammar = compile_grammar(info, grammar=T.call_grammar(s), field="tools")
        out = engine.generate("What is the weather in Paris?", grammar=T.call_grammar(s),
                              max_tokens=60, temperature=0)
        assert grammar.kind == "grammar" and out.finish_reason == "stop", out
        _, calls = T.parse_calls(out.text, s)
        assert len(calls) == 1
        if s.named:
            assert calls[0].name == "weather" and "city" in json.loads(calls[0].arguments)
    bad = T.parse_tool_request([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}],
        "required", None)
    with pytest.raises(ContractError) as err:
        compile_grammar(info, grammar=T.call_grammar(bad), field="tools")
    assert err.value.field == "tools" and "uniqueItems" in err.value.message


def test_required_with_parallel_calls_ends_within_the_call_bound(engine):
    """SmolLM2 forced to call with parallel calls on calls again and again: the grammar ends
    the turn after MAX_PARALLEL_CALLS well-formed calls instead of running out of tokens."""
    s = spec("required", True)
    out = engine.generate("What is the weather in Paris?", grammar=T.call_grammar(s),
                          max_tokens=40 * T.MAX_PARALLEL_CALLS, temperature=0)
    _, calls = T.parse_calls(out.text, s)
    assert out.finish_reason == "stop", out
    assert 1 <= len(calls) <= T.MAX_PARALLEL_CALLS


def test_forced_call_over_local_defs_compiles_generates_and_validates(engine):
    """Parameters with local ``#/$defs/...`` pointers (pydantic's shape) are forced: before,
    the wrapper nested them and every pointer missed. Two functions both name ``$defs/Item``
    with different shapes: each resolves inside its own parameters."""
    import jsonschema

    from onepass.generate.grammar import compile_grammar, tokenizer_info

    def defs_tool(name: str, item: dict) -> dict:
        return {"type": "function", "function": {"name": name, "strict": True, "parameters": {
            "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
            "required": ["item"], "additionalProperties": False, "$defs": {"Item": item}}}}

    tools = [defs_tool("order", {"type": "object", "properties": {"sku": {"type": "string",
                                                                          "maxLength": 8}},
                                 "required": ["sku"], "additionalProperties": False}),
             defs_tool("count", {"type": "integer", "minimum": 0, "maximum": 9})]
    info = tokenizer_info(engine.backend)
    for named in ("order", "count"):
        s = T.parse_tool_request(tools, {"type": "function", "function": {"name": named}}, False)
        compile_grammar(info, grammar=T.call_grammar(s), field="tools")
        out = engine.generate("Order one apple.", grammar=T.call_grammar(s), max_tokens=40,
                              temperature=0)
        assert out.finish_reason == "stop", out
        (call,) = T.parse_calls(out.text, s)[1]
        assert call.name == named
        jsonschema.validate(json.loads(call.arguments), s.function(named).parameters)
