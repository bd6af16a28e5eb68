"""The OpenAI wire translation (server/openai/) and the response store, without a model:
bad bodies name their field, unimplemented fields are refused (never ignored), and every
object we build is what the official SDK's own types accept."""

from __future__ import annotations

import json

import pytest

from onepass.contract import ContractError
from onepass.generate.scheduler import Finish, TokenInfo
from onepass.server import openai as W
from onepass.server.response_store import ResponseStore, Stored

openai_types = pytest.importorskip("openai.types")
from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

MSG = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "weather",
                                                  "arguments": '{"city":"Paris"}'}}]}

# (body, field named by the error, words the message must contain)
CHAT_BAD = [
    ([], "body", "JSON object"),
    ({}, "messages", "non-empty array"),
    ({"messages": []}, "messages", "non-empty array"),
    ({"messages": MSG, "model": ""}, "model", "non-empty string"),
    ({"messages": MSG, "temperature": 3}, "temperature", "[0, 2]"),
    ({"messages": MSG, "temperature": "hot"}, "temperature", "a string"),
    ({"messages": MSG, "top_p": 0}, "top_p", "(0, 1]"),
    ({"messages": MSG, "top_k": -1}, "top_k", ">= 0"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"messages": MSG, "max_tokens": 1.5}, "max_tokens", "1.5"),
    ({"messages": MSG, "max_completion_tokens": True}, "max_completion_tokens", "boolean"),
    ({"messages": MSG, "max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens",
     "not both"),
    ({"messages": MSG, "n": 0}, "n", "from 1 to 8"),
    ({"messages": MSG, "n": 9}, "n", "from 1 to 8"),
    ({"messages": MSG, "stream": "yes"}, "stream", "true or false"),
    ({"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options",
     "stream: true"),
    ({"messages": MSG, "stream": True, "stream_options": {"usage": True}},
     "stream_options.usage", "unknown option"),
    ({"messages": MSG, "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage", "true or false"),
    ({"messages": MSG, "logprobs": 2}, "logprobs", "true or false"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
    ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"messages": MSG, "stop": [""]}, "stop", "empty string"),
    ({"messages": MSG, "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"messages": MSG, "seed": 2**64}, "seed", "integer"),
    ({"messages": MSG, "presence_penalty": -2.5}, "presence_penalty", "[-2, 2]"),
    ({"messages": MSG, "repetition_penalty": 0}, "repetition_penalty", "(0, 2]"),
    ({"messages": MSG, "tools": [{"type": "function"}]}, "tools[0].function", "name, "
     "description, parameters"),
    ({"messages": MSG, "tools": {"type": "function"}}, "tools", "array of function tools"),
    ({"messages": MSG, "tools": [{"type": "retrieval"}]}, "tools[0].type", "only function"),
    ({"messages": MSG, "tools": [TOOL, TOOL]}, "tools[1].function.name", "declared twice"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools[0].function.name", "letters"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, "tools[0].function.parameters",
     "type object"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": 3}}}]},
     "tools[0].function.parameters", "valid JSON Schema"),
    ({"messages": MSG, "tool_choice": "required"}, "tool_choice", "at least one function"),
    ({"messages": MSG, "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "auto"),
    ({"messages": MSG, "tools": [TOOL], "tool_choice": {"type": "function",
                                                        "function": {"name": "nope"}}},
     "tool_choice.function.name", "unknown function 'nope'"),
    ({"messages": MSG, "tools": [TOOL], "parallel_tool_calls": "no"}, "parallel_tool_calls",
     "true or false"),
    ({"messages": MSG, "tools": [TOOL], "response_format": {"type": "json_object"}},
     "response_format", "cannot be combined with tools"),
    ({"messages": MSG, "tools": [TOOL], "tool_choice": "required", "stop": ["x"]}, "stop",
     "required tool call"),
    ({"messages": [*MSG, {"role": "tool", "content": "r", "tool_call_id": "c1"}]},
     "messages[1].tool_call_id", "no pending tool call"),
    ({"messages": [*MSG, CALLED, {"role": "user", "content": "and?"}]}, "messages[2]",
     "no result yet"),
    ({"messages": [*MSG, {**CALLED, "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "w",
                                                                 "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "JSON object"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls", "only assistant"),
    ({"messages": MSG, "response_format": {"type": "xml"}}, "response_format.type",
     "json_schema"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "needs a schema"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {}, "strict": "yes"}}}, "response_format.json_schema.strict",
     "boolean"),
    ({"messages": MSG, "response_format": {"type": "json_object"}, "grammar": "start: \"a\""},
     "grammar", "cannot be combined"),
    ({"messages": MSG, "grammar": ""}, "grammar", "non-empty"),
    ({"messages": MSG, "response_format": {"type": "json_object"}, "stop": ["}"]}, "stop",
     "grammar decides"),
    ({"messages": MSG, "store": True}, "store", "not supported yet"),
    ({"messages": MSG, "reasoning_effort": "extreme"}, "reasoning_effort", "one of none"),
    ({"messages": MSG, "reasoning_effort": ["high"]}, "reasoning_effort", "one of none"),
    ({"messages": MSG, "reasoning_effort": "x" * 100000}, "reasoning_effort", "one of none"),
    ({"messages": MSG, "chat_template_kwargs": {"k": {"deep": 1}}}, "chat_template_kwargs.k",
     "nested"),
    ({"messages": MSG, "chat_template_kwargs": {"messages": "x"}},
     "chat_template_kwargs.messages", "reserved"),
    ({"messages": MSG, "chat_template_kwargs": {"k": 2**80}}, "chat_template_kwargs.k",
     "2**53"),
    ({"messages": MSG, "chat_template_kwargs": "x"}, "chat_template_kwargs", "an object"),
    ({"messages": MSG, "temprature": 0.5}, "temprature", "unknown field"),
]


@pytest.mark.parametrize(("body", "field", "words"), CHAT_BAD)
def test_bad_chat_bodies_name_their_field(body, field, words):
    with pytest.raises(ContractError) as err:
        W.parse_chat(body)
    assert err.value.field == field
    assert words in err.value.message, err.value.message
    assert str(err.value).startswith(f"{field}: ")


COMPLETION_BAD = [
    ({}, "prompt", "non-empty string"),
    ({"prompt": ""}, "prompt", "non-empty string"),
    ({"prompt": [1, "a"]}, "prompt", "token ids"),
    ({"prompt": [True]}, "prompt", "token ids"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "with echo: true"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens", ">= 0"),
    ({"prompt": "x", "logprobs": 6}, "logprobs", "0 to 5"),
    ({"prompt": "x", "logprobs": True}, "logprobs", "boolean"),
    ({"prompt": "x", "echo": "yes"}, "echo", "true or false"),
    ({"prompt": "x", "suffix": "tail"}, "suffix", "not supported yet"),
    ({"prompt": "x", "best_of": 3}, "best_of", "not supported yet"),
    ({"prompt": "x", "messages": MSG}, "messages", "unknown field"),
    ({"prompt": "x", "max_tokens": 0, "echo": True, "grammar": "start: \"a\""}, "grammar",
     "generates nothing"),
    ({"prompt": "x", "grammar": 5}, "grammar", "Lark or GBNF"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format",
     "unknown field"),
]


@pytest.mark.parametrize(("body", "field", "words"), COMPLETION_BAD)
def test_bad_completion_bodies_name_their_field(body, field, words):
    with pytest.raises(ContractError) as err:
        W.parse_completion(body)
    assert err.value.field == field
    assert words in err.value.message, err.value.message


RESPONSES_BAD = [
    ({}, "input", "non-empty string"),
    ({"input": ""}, "input", "non-empty string"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content", "string or an array"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "user"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "user"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "w", "arguments": "{"}]},
     "input[0].arguments", "not valid JSON"),
    ({"input": [{"type": "function_call", "name": "w", "arguments": "{}"}]},
     "input[0].call_id", "call's id"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "not supported yet"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "function", "name": "g"}}, "tool_choice.name", "unknown function 'g'"),
    ({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0]",
     "unknown key(s) function"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0]", "text part"),
    ({"input": "x", "instructions": 5}, "instructions", "a string"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"input": "x", "previous_response_id": ""}, "previous_response_id", "response id"),
    ({"input": "x", "store": "true"}, "store", "true or false"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata", "string values"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "r"}}},
     "text.format.schema", "needs a schema"),
    ({"input": "x", "text": {"verbosity": "high"}}, "text.verbosity", "medium"),
    ({"input": "x", "text": {"style": "x"}}, "text.style", "unknown key"),
    ({"input": "x", "text": "json"}, "text", "an object"),
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort", "one of none"),
    ({"input": "x", "reasoning": {"effort": 3}}, "reasoning.effort", "one of none"),
    ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning.summary", "not supported"),
    ({"input": "x", "reasoning": {"budget": 9}}, "reasoning.budget", "unknown option"),
    ({"input": "x", "reasoning": "high"}, "reasoning", "an object"),
    ({"input": "x", "grammar": 'start: "a"', "text": {"format": {"type": "json_object"}}},
     "grammar", "cannot be combined"),
    ({"input": "x", "grammar": ""}, "grammar", "non-empty"),
    ({"input": "x", "truncation": "auto"}, "truncation", "never truncated"),
    ({"input": "x", "background": True}, "background", "not supported"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs", "not supported"),
    ({"input": "x", "temperature": -1}, "temperature", "[0, 2]"),
    ({"input": "x", "max_tokens": 5}, "max_tokens", "unknown field"),
]


@pytest.mark.parametrize(("body", "field", "words"), RESPONSES_BAD)
def test_bad_responses_bodies_name_their_field(body, field, words):
    with pytest.raises(ContractError) as err:
        W.parse_responses(body)
    assert err.value.field == field
    assert words in err.value.message, err.value.message


def test_structured_output_fields_become_one_grammar_spec():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = W.parse_chat({"messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}})
    assert chat.grammar.json_schema == schema and chat.grammar.name == "r"
    assert chat.grammar.field == "response_format.json_schema.schema"
    assert W.parse_chat({"messages": MSG, "response_format": {"type": "text"}}).grammar is None
    assert W.parse_chat({"messages": MSG, "response_format": {"type": "json_object"}}
                        ).grammar.json_object
    lark = 'start: "yes" | "no"'
    assert W.parse_chat({"messages": MSG, "grammar": lark}).grammar.grammar == lark
    assert W.parse_completion({"prompt": "x", "grammar": lark}).grammar.field == "grammar"
    fmt = {"type": "json_schema", "name": "r", "schema": schema, "strict": True}
    req = W.parse_responses({"input": "x", "text": {"format": fmt, "verbosity": "medium"}})
    assert req.grammar.json_schema == schema and req.grammar.field == "text.format.schema"
    body = W.response_object("resp_1", 1, "m", req, status="completed", limit=3)
    assert body["text"] == {"format": fmt}
    Response.model_validate(body)
    plain = W.parse_responses({"input": "x"})
    assert plain.grammar is None and W.response_object(
        "resp_1", 1, "m", plain, status="completed", limit=3)["text"] == {
        "format": {"type": "text"}}


def test_chat_request_maps_openai_fields_onto_the_sampler():
    req = W.parse_chat({
        "model": "m", "messages": MSG, "max_completion_tokens": 7, "temperature": 0,
        "logprobs": True, "top_logprobs": 3, "n": 2, "seed": 5, "stop": "x",
        "stream": True, "stream_options": {"include_usage": True},
        "user": "u", "metadata": {"a": "b"}, "tools": [], "tool_choice": "none",
        "response_format": {"type": "text"}, "store": False, "top_p": None,
    })
    assert (req.model, req.max_tokens, req.max_tokens_field, req.n) == ("m", 7,
                                                                        "max_completion_tokens", 2)
    assert req.stream and req.include_usage and req.logprobs
    assert req.params.logprobs == 3 and req.params.greedy and req.params.seed == 5
    assert req.params.stop == ("x",) and req.params.top_p == 1.0  # null means the default
    plain = W.parse_chat({"messages": MSG})
    assert plain.params.logprobs is None and plain.max_tokens is None and plain.n == 1
    assert W.parse_chat({"messages": MSG, "logprobs": True}).params.logprobs == 0


def test_completion_request_scoring_and_batches_of_one():
    req = W.parse_completion({"prompt": [[1, 2, 3]], "max_tokens": 0, "echo": True,
                              "logprobs": 2})
    assert req.prompt == [1, 2, 3] and req.scoring and req.params.logprobs == 2
    assert W.parse_completion({"prompt": ["hello"]}).prompt == "hello"


def test_responses_input_items_and_messages():
    req = W.parse_responses({"input": [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "c",
                                           "annotations": []}]},
    ], "instructions": "sys", "store": True, "metadata": {"k": "v"}})
    assert req.messages == [{"role": "developer", "content": "be brief"},
                            {"role": "user", "content": "ab"},
                            {"role": "assistant", "content": "c"}]
    assert [i["content"][0]["type"] for i in req.input_items] == ["input_text", "input_text",
                                                                  "output_text"]
    assert len({i["id"] for i in req.input_items}) == 3
    assert all(i["id"].startswith("msg_") for i in req.input_items)
    assert req.store and req.instructions == "sys" and req.metadata == {"k": "v"}
    assert W.parse_responses({"input": "x"}).messages == [{"role": "user", "content": "x"}]


def test_input_items_page_order_limit_and_cursors():
    items = W.parse_input([{"role": "user", "content": str(i)} for i in range(5)])
    ids = [i["id"] for i in items]
    page = W.input_items_page(items, {})
    assert [i["id"] for i in page["data"]] == ids[::-1]  # desc by default
    assert page["first_id"] == ids[4] and page["last_id"] == ids[0] and not page["has_more"]
    page = W.input_items_page(items, {"order": "asc", "limit": "2"})
    assert [i["id"] for i in page["data"]] == ids[:2] and page["has_more"]
    page = W.input_items_page(items, {"order": "asc", "after": ids[1], "before": ids[4]})
    assert [i["id"] for i in page["data"]] == ids[2:4] and not page["has_more"]
    for query, field in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                         ({"order": "up"}, "order"), ({"after": "msg_x"}, "after"),
                         ({"page": "2"}, "page")):
        with pytest.raises(ContractError) as err:
            W.input_items_page(items, query)
        assert err.value.field == field


# --------------------------------------------------------------------------- shapes


TOKENS = [TokenInfo(1, "Hi", -0.5, (("Hi", -0.5), ("Yo", -1.5))),
          TokenInfo(2, " é", -0.25, ((" é", -0.25),))]
FINISHES = [Finish("stop", 10, 2, 4), Finish("length", 10, 3, 4)]


def test_usage_counts_the_prompt_once_and_sums_completions():
    usage = W.Usage.of(FINISHES)
    assert usage.chat() == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                            "prompt_tokens_details": {"cached_tokens": 4},
                            "completion_tokens_details": {"reasoning_tokens": 0}}
    assert usage.responses()["input_tokens_details"] == {"cached_tokens": 4,
                                                         "cache_write_tokens": 0}
    assert usage.responses()["output_tokens_details"] == {"reasoning_tokens": 0}


def test_chat_completion_parses_with_the_sdk():
    choices = [W.Choice("Hi é", list(TOKENS), "stop"), W.Choice("Yo", [], "length")]
    body = W.chat_completion("chatcmpl-1", 5, "m", choices, W.Usage.of(FINISHES), True)
    parsed = ChatCompletion.model_validate(json.loads(json.dumps(body)))
    assert parsed.choices[0].message.content == "Hi é"
    assert parsed.choices[1].finish_reason == "length"
    first = parsed.choices[0].logprobs.content[1]
    assert first.token == " é" and first.bytes == list(" é".encode())
    assert parsed.choices[0].logprobs.content[0].top_logprobs[1].token == "Yo"
    assert parsed.usage.prompt_tokens_details.cached_tokens == 4
    assert W.chat_completion("c", 5, "m", choices, W.Usage.of(FINISHES),
                             False)["choices"][0]["logprobs"] is None


def test_chat_chunks_parse_with_the_sdk():
    first = W.chat_chunk("c", 1, "m", 0, role=True, content="")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    mid = W.chat_chunk("c", 1, "m", 1, content="x", tokens=TOKENS[:1])
    last = W.chat_chunk("c", 1, "m", 1, finish_reason="length")
    assert last["choices"][0]["delta"] == {}
    usage = W.usage_chunk("c", 1, "m", W.Usage.of(FINISHES))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 15
    for chunk in (first, mid, last, usage):
        ChatCompletionChunk.model_validate(chunk)
    assert ChatCompletionChunk.model_validate(mid).choices[0].index == 1


def test_text_completion_logprobs_offsets_and_echo():
    lp = W.TextLogprobs()
    lp.add_prompt([7, 8, 9], [(-1.0, ((8, -1.0),)), (-2.0, ((9, -2.0), (7, -3.0)))],
                  lambda ids: {7: "The", 8: " cat", 9: " sat"}[ids[0]])
    lp.add_generated(TOKENS)
    wire = lp.wire()
    assert wire["tokens"] == ["The", " cat", " sat", "Hi", " é"]
    assert wire["token_logprobs"] == [None, -1.0, -2.0, -0.5, -0.25]
    assert wire["top_logprobs"][0] is None and wire["top_logprobs"][2] == {" sat": -2.0,
                                                                          "The": -3.0}
    assert wire["text_offset"] == [0, 3, 7, 11, 13]
    # the echoed first token has no logprob: null, as OpenAI and vLLM send it (the SDK's
    # types say float, but it parses responses without validating them)
    generated = W.TextLogprobs()
    generated.add_generated(TOKENS)
    body = W.text_completion("cmpl-1", 1, "m", ["Hi é"], ["stop"], [generated],
                             W.Usage.of(FINISHES[:1]))
    parsed = Completion.model_validate(body)
    assert parsed.choices[0].logprobs.text_offset == [0, 2]
    assert parsed.usage.total_tokens == 12
    chunk = W.text_completion("cmpl-1", 1, "m", ["x"], [None], [None], None, first_index=3)
    assert chunk["choices"][0]["index"] == 3 and "usage" not in chunk


def test_take_keeps_the_running_offset():
    lp = W.TextLogprobs()
    lp.add_generated(TOKENS[:1])
    assert lp.take()["text_offset"] == [0]
    lp.add_generated(TOKENS[1:])
    assert lp.take() == {"tokens": [" é"], "token_logprobs": [-0.25],
                         "top_logprobs": [{" é": -0.25}], "text_offset": [2]}


def test_response_objects_and_events_parse_with_the_sdk():
    req = W.parse_responses({"input": "x", "instructions": "sys", "max_output_tokens": 3})
    usage = W.Usage.of(FINISHES[1:])
    status = W.response_status("length")
    body = W.response_object("resp_1", 1, "m", req, status=status, limit=3,
                             output=[W.output_message("msg_1", "abc", status)], usage=usage)
    parsed = Response.model_validate(body)
    assert parsed.output_text == "abc" and parsed.status == "incomplete"
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.usage.input_tokens == 10 and parsed.usage.output_tokens == 3
    done = W.response_object("resp_1", 1, "m", req, status=W.response_status("stop"), limit=3)
    assert done["incomplete_details"] is None and done["status"] == "completed"
    events = TypeAdapter(ResponseStreamEvent)
    start = W.response_object("resp_1", 1, "m", req, status="in_progress", limit=3)
    for event in (
        {"type": "response.created", "sequence_number": 0, "response": start},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
         "item": W.output_message("msg_1", "", "in_progress")},
        {"type": "response.content_part.added", "sequence_number": 2, "output_index": 0,
         "item_id": "msg_1", "content_index": 0, "part": W.output_text("")},
        {"type": "response.output_text.delta", "sequence_number": 3, "output_index": 0,
         "item_id": "msg_1", "content_index": 0, "delta": "abc", "logprobs": []},
        {"type": "response.incomplete", "sequence_number": 4, "response": body},
    ):
        assert events.validate_python(event).type == event["type"]


def test_sse_frames():
    assert W.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert W.sse({"a": 1}, event="response.created") == (
        b'event: response.created\ndata: {"a":1}\n\n')
    assert W.DONE == b"data: [DONE]\n\n"
    with pytest.raises(ValueError):
        W.sse({"x": float("nan")})


# --------------------------------------------------------------------------- store


def _stored(text: str = "x") -> Stored:
    return Stored({"id": "r", "text": text}, "m", [], [{"role": "user", "content": text}])


def test_store_evicts_least_recently_used_by_entries():
    store = ResponseStore(max_entries=2)
    store.put("a", _stored())
    store.put("b", _stored())
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", _stored())
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert len(store) == 2


def test_store_bounds_bytes_and_refuses_an_entry_over_the_bound():
    one = _stored("y" * 100).size()
    store = ResponseStore(max_bytes=2 * one + 10)
    for rid in "abc":
        assert store.put(rid, _stored("y" * 100))
    assert store.get("a") is None and len(store) == 2 and store.bytes == 2 * one
    assert not store.put("big", _stored("z" * 10_000))
    assert store.get("big") is None and len(store) == 2


def test_store_expires_by_age_and_deletes():
    now = [0.0]
    store = ResponseStore(max_age=60, clock=lambda: now[0])
    store.put("a", _stored())
    now[0] = 59.0
    assert store.get("a") is not None  # a read does not extend the age
    now[0] = 60.0
    assert store.get("a") is None and store.bytes == 0
    store.put("b", _stored())
    assert store.delete("b") and not store.delete("b") and store.get("b") is None
    with pytest.raises(ValueError):
        ResponseStore(max_entries=0)


# ------------------------------------------------------------ the documentation models


def test_documented_request_fields_are_exactly_the_accepted_ones():
    """openai_schema documents every field openai.py accepts, and nothing it refuses."""
    from onepass.server import openai_schema as S

    for model, accepted in ((S.ChatCompletionRequestModel, W.CHAT_FIELDS),
                            (S.CompletionRequestModel, W.COMPLETION_FIELDS),
                            (S.ResponseRequestModel, W.RESPONSES_FIELDS)):
        documented = set(model.model_fields)
        assert documented == set(accepted), (model.__name__, documented ^ set(accepted))
        assert all(model.model_fields[f].description for f in documented), model.__name__
    assert set(S.StreamOptions.model_fields) == set(W.STREAM_OPTIONS)


def test_documented_examples_are_accepted_and_ranges_match_the_parser():
    from onepass.server import openai_schema as S

    parsers = {S.ChatCompletionRequestModel: W.parse_chat,
               S.CompletionRequestModel: W.parse_completion,
               S.ResponseRequestModel: W.parse_responses}
    checked = 0
    for model, parse in parsers.items():
        schema = model.model_json_schema()
        parse(schema["examples"][0])
        props = schema["properties"]
        # the documented bounds are the parser's: one past each bound is refused
        example = {k: schema["examples"][0][k] for k in schema["required"]}
        if "echo" in props:
            example["echo"] = True  # completions: max_tokens 0 is taken only with echo
        for name, spec in props.items():
            number = next((s for s in spec.get("anyOf", [spec]) if s.get("type") in
                           ("integer", "number")), None)
            if number is None or name in ("top_logprobs",):
                continue
            step = 1 if number["type"] == "integer" else 0.5
            for key, outside in (("maximum", step), ("minimum", -step),
                                 ("exclusiveMinimum", 0), ("exclusiveMaximum", 0)):
                if key in number:
                    body = {**example, name: number[key] + outside}
                    with pytest.raises(ContractError) as err:
                        parse(body)
                    assert err.value.field == name, (model.__name__, name, key)
                    checked += 1
                    if key in ("maximum", "minimum"):
                        parse({**example, name: number[key]})  # the bound itself is taken
    assert checked >= 3 * 12  # every sampler range on each route, plus n, limits, logprobs


def test_documented_response_models_match_the_built_objects():
    """Extra fields are forbidden in the models: a key added or dropped fails here."""
    from onepass.server import openai_schema as S

    choices = [W.Choice("Hi é", list(TOKENS), "stop"), W.Choice("Yo", [], "length")]
    usage = W.Usage.of(FINISHES)
    S.ChatCompletionResponseModel.model_validate(
        W.chat_completion("chatcmpl-1", 5, "m", choices, usage, True))
    lp = W.TextLogprobs()
    lp.add_generated(TOKENS)
    S.CompletionResponseModel.model_validate(
        W.text_completion("cmpl-1", 1, "m", ["Hi é"], ["stop"], [lp], usage))
    req = W.parse_responses({"input": "x", "store": True, "metadata": {"k": "v"}})
    body = W.response_object("resp_1", 1, "m", req, status="incomplete", limit=3,
                             output=[W.output_message("msg_1", "abc", "incomplete")],
                             usage=W.Usage.of(FINISHES[1:]))
    S.ResponseObjectModel.model_validate(body)
    S.ResponseInputItemsModel.model_validate(W.input_items_page(req.input_items, {}))
    with pytest.raises(ValueError):
        S.ResponseObjectModel.model_validate({**body, "surprise": 1})
