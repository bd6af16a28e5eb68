"""Structured output and function tools over HTTP against a real `onepass serve` process, driven
by the official `openai` SDK: its structured-output helpers return parsed objects, every
completed output validates, refusals are 400s naming the field."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")
from pydantic import BaseModel, Field  # noqa: E402


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad", "calm"]


ASK = [{"role": "user", "content": "Invent a person: their name, age and mood."}]
PERSON_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "person", "schema": Person.model_json_schema(), "strict": True}}


# --------------------------------------------------------------------------- structured output


def test_chat_parse_helper_returns_a_parsed_pydantic_object(client, model):
    out = client.chat.completions.parse(model=model, messages=ASK, response_format=Person,
                                        max_tokens=80, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def test_responses_parse_helper_returns_a_parsed_pydantic_object(client, model):
    out = client.responses.parse(model=model, input="Invent a person: name, age and mood.",
                                 text_format=Person, max_output_tokens=80, temperature=0)
    assert out.status == "completed"
    assert isinstance(out.output_parsed, Person)
    assert out.text.format.type == "json_schema"


def test_sampled_choices_all_validate_and_streaming_matches(client, model):
    schema = Person.model_json_schema()
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=80,
                                         temperature=1.0, seed=7, n=4,
                                         response_format=PERSON_FORMAT)
    completed = [c for c in out.choices if c.finish_reason == "stop"]
    assert len(completed) >= 3, [c.finish_reason for c in out.choices]
    for choice in completed:
        jsonschema.validate(json.loads(choice.message.content), schema)
    sync = client.chat.completions.create(model=model, messages=ASK, max_tokens=80,
                                          temperature=0, response_format=PERSON_FORMAT)
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=ASK, max_tokens=80, temperature=0, stream=True,
            response_format=PERSON_FORMAT) if c.choices)
    assert streamed == sync.choices[0].message.content
    json.loads(streamed)


def test_json_object_always_parses_as_an_object(client, model):
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give me a JSON object."}],
        max_tokens=60, temperature=0, response_format={"type": "json_object"})
    choice = out.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # a length stop may be partial, but it is still the start of an object
        assert choice.message.content.startswith("{")


def test_a_length_limited_structured_output_is_length_and_incomplete(client, model):
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=3,
                                         temperature=0, response_format=PERSON_FORMAT)
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].message.content.startswith("{")
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=model, messages=ASK, response_format=Person,
                                      max_tokens=3, temperature=0)
    resp = client.responses.create(model=model, input="Invent a person.", max_output_tokens=3,
                                   text={"format": {"type": "json_schema", "name": "person",
                                                    "schema": Person.model_json_schema()}})
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"


def test_grammar_extension_on_chat_and_completions(client, model):
    lark = 'start: "yes" | "no"'
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=5,
        temperature=1.0, seed=3, n=3, extra_body={"grammar": lark})
    assert {c.message.content for c in chat.choices} <= {"yes", "no"}
    assert all(c.finish_reason == "stop" for c in chat.choices)
    gbnf = 'root ::= [0-9] [0-9] "!"'
    text = client.completions.create(model=model, prompt="A number:", max_tokens=8,
                                     temperature=0, extra_body={"grammar": gbnf})
    choice = text.choices[0]
    assert choice.finish_reason == "stop" and len(choice.text) == 3
    assert choice.text[:2].isdigit() and choice.text.endswith("!")


REFUSED = [
    ("/v1/chat/completions",
     {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
         "name": "s", "schema": {"type": "array", "uniqueItems": True}}}},
     "response_format.json_schema.schema", "uniqueItems"),
    ("/v1/responses",
     {"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {
         "type": "object", "not": {"required": ["a"]}}}}},
     "text.format.schema", "not"),
    ("/v1/chat/completions", {"messages": ASK, "grammar": "start: (("}, "grammar",
     "grammar"),
    ("/v1/completions", {"prompt": "x", "grammar": "root ::= undefined_rule"}, "grammar",
     "grammar"),
    ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_object"},
                              "stop": ["}"]}, "stop", "grammar"),
]


def test_constructs_the_engine_cannot_enforce_are_400s_naming_them(server, model):
    with httpx.Client(base_url=server, timeout=60) as http:
        for path, body, param, words in REFUSED:
            r = http.post(path, json={"model": model, **body})
            assert r.status_code == 400, (path, body, r.text)
            error = r.json()["error"]
            assert error["param"] == param, (body, error)
            assert words in error["message"], error
        metrics = http.get("/metrics").text
        assert "onepass_generation_active_sequences 0" in metrics  # no slot was taken


# --------------------------------------------------------------------------- function tools

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
           "required": ["city"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "The current weather in a city",
    "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "time", "description": "The time in a city",
                                      "parameters": WEATHER}}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _answer(client, model, messages, call_id, name, arguments):
    """Send the call and its result back; the conversation goes on to a text answer."""
    follow = [*messages,
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": call_id, "type": "function",
                   "function": {"name": name, "arguments": arguments}}]},
              {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 degrees"}]
    out = client.chat.completions.create(model=model, messages=follow, tools=CHAT_TOOLS,
                                         tool_choice="none", max_tokens=24, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    assert not choice.message.tool_calls
    return choice.message.content


def test_chat_tool_round_trip_required(client, model):
    out = client.chat.completions.create(model=model, messages=ASK_WEATHER, tools=CHAT_TOOLS,
                                         tool_choice="required", max_tokens=60, temperature=0,
                                         parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("weather", "time")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    _answer(client, model, ASK_WEATHER, call.id, call.function.name, call.function.arguments)


def test_chat_tool_round_trip_named_function_streaming(client, model):
    named = {"type": "function", "function": {"name": "time"}}
    with client.chat.completions.stream(model=model, messages=ASK_WEATHER, tools=CHAT_TOOLS,
                                        tool_choice=named, max_tokens=60,
                                        temperature=0) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls][0] == "time"
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    sync = client.chat.completions.create(model=model, messages=ASK_WEATHER, tools=CHAT_TOOLS,
                                          tool_choice=named, max_tokens=60, temperature=0)
    assert [c.function.arguments for c in sync.choices[0].message.tool_calls] == [
        c.function.arguments for c in choice.message.tool_calls]
    # the raw chunks: id and name first, the arguments after, then finish_reason tool_calls
    chunks = list(client.chat.completions.create(
        model=model, messages=ASK_WEATHER, tools=CHAT_TOOLS, tool_choice=named,
        max_tokens=60, temperature=0, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert deltas[0][0].id and deltas[0][0].function.name == "time"
    assert deltas[0][0].function.arguments == "" and deltas[1][0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    _answer(client, model, ASK_WEATHER, call.id, "time", call.function.arguments)


def test_responses_tool_round_trip_required_and_streaming(client, model):
    tools = [{"type": "function", "name": "weather", "description": "Weather in a city",
              "parameters": WEATHER, "strict": True}]
    first = client.responses.create(model=model, input="What is the weather in Seoul?",
                                    tools=tools, tool_choice="required", temperature=0,
                                    max_output_tokens=60, parallel_tool_calls=False)
    assert first.status == "completed" and first.tool_choice == "required"
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    reply = client.responses.create(
        model=model, temperature=0, max_output_tokens=24, tools=tools, tool_choice="none",
        input=[{"role": "user", "content": "What is the weather in Seoul?"},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "Sunny, 20 degrees Celsius"}])
    assert reply.output_text and reply.output[0].type == "message"
    events = list(client.responses.create(
        model=model, input="What is the weather in Seoul?", tools=tools,
        tool_choice={"type": "function", "name": "weather"}, temperature=0,
        max_output_tokens=60, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments
    assert events[-1].response.output[-1].type == "function_call"


TOOL_REFUSALS = [
    ({"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": "weather"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "tools"),
]


def test_tool_refusals_are_400s_naming_the_field(server, model):
    with httpx.Client(base_url=server, timeout=60) as http:
        for body, param in TOOL_REFUSALS:
            r = http.post("/v1/chat/completions",
                          json={"model": model, "messages": ASK_WEATHER, **body})
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == param, (body, r.json())
