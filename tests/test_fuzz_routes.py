"""Hostile bodies on every route (hypothesis), against the real app and model: never a 5xx,
never longer than a stated bound per request, and the server still answers afterwards.

The bodies are arbitrary JSON, valid bodies with one field replaced by an arbitrary value, and
known-dangerous shapes (exponential ``$ref`` trees, huge/NaN-adjacent numbers, deep nesting).
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from onepass.generate.runner import TextGenerator  # noqa: E402
from onepass.server.app import create_app  # noqa: E402
from onepass.server.settings import ServerSettings  # noqa: E402

# A request may do the work it is allowed to: these bodies ask for at most a few questions,
# fields or output tokens, so each must be answered (or refused) within this bound.
SECONDS_PER_REQUEST = 20.0

VALID = {
    "/v1/systemone": {
        "state": "My parcel is late.",
        "questions": {"late": {"type": "noul", "instructions": "The parcel is late."},
                      "team": {"type": "choice", "instructions": "Which team?",
                               "criteria": {"shipping": "parcels", "billing": "money"}},
                      "mood": {"type": "score", "instructions": "How angry?",
                               "criteria": ["calm", "annoyed", "furious"]}},
    },
    "/v1/decisions": {
        "model": "jev-latest", "input": [
            {"role": "user", "content": "Server is down!"},
            {"type": "function_call", "call_id": "c", "name": "ping", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "timeout"}],
        "questions": [
            {"type": "predicate", "name": "urgent", "instructions": "It is urgent."},
            {"type": "choice", "instructions": "Which team?",
             "choices": [{"value": "ops"}, {"value": True}, {"value": "true"}]},
            {"type": "score", "instructions": "Severity?",
             "levels": [{"label": "low"}, {"label": "high", "description": "down"}]}],
        "prompt_cache_key": "fuzz",
    },
    "/v1/decisions/schema": {
        "context": "Server is down!", "mode": "batch",
        "schema": {"type": "object", "properties": {
            "urgent": {"type": "boolean"},
            "team": {"enum": ["ops", "support"]},
            "severity": {"type": "integer", "minimum": 1, "maximum": 3}}},
    },
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0,
    },
    "/v1/completions": {"prompt": "Hello", "max_tokens": 4},
    "/v1/responses": {"input": "Say hi.", "max_output_tokens": 4},
}

# integers past a double's range and past Python's 4,300-digit int/str limit (a 500 before)
huge_integers = st.integers(min_value=300, max_value=6000).flatmap(
    lambda digits: st.sampled_from([10**digits - 1, -(10**digits)]))
# text holding a lone UTF-16 surrogate ("\ud800" in JSON; a 500 on every text route before)
lone_surrogates = st.tuples(st.text(max_size=8), st.characters(categories=["Cs"]),
                            st.text(max_size=8)).map("".join)
keys = st.text(max_size=12) | lone_surrogates
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | huge_integers | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
    | lone_surrogates,
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(keys, children, max_size=6),
    max_leaves=30,
)


def _ref_bomb(depth: int) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {
        "a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(depth)}
    defs[f"d{depth}"] = {"type": "object"}
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}


def _ref_chain(links: int) -> dict:
    """A chain of object ``$ref``s: 1,000 links overflowed llguidance's native stack."""
    defs = {f"d{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def _lark_chain(rules: int) -> str:
    return "\n".join(["start: r0", *(f'r{i}: "a" r{i + 1}' for i in range(rules)),
                      f'r{rules}: "a"'])


def _chat(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


def _forced_tool(parameters: dict) -> dict:
    return _chat(tool_choice="required", tools=[{"type": "function", "function": {
        "name": "f", "strict": True, "parameters": parameters}}])


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# references a request must never make the server follow (it has no network or file access to
# give): each is refused before anything is compiled or validated
REMOTE_REFS = ["http://127.0.0.1:9/x.json", "https://example.invalid/s.json", "file:///etc/passwd",
               "/etc/hostname", "other.json#/a", "urn:x:y", "//host/x"]

DANGEROUS = [
    ("/v1/chat/completions", _chat(response_format=_json_schema(_ref_chain(1000)))),
    ("/v1/chat/completions", _chat(response_format=_json_schema(_ref_chain(3000)))),
    ("/v1/chat/completions", _chat(grammar=_lark_chain(3000))),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "grammar": _lark_chain(3000)}),
    ("/v1/chat/completions", _chat(grammar="start: " + " | ".join(
        f'"w{i}x"' for i in range(2100)))),
    ("/v1/chat/completions", _forced_tool(_ref_chain(1000))),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "text": {"format": {
        "type": "json_schema", "name": "x", "schema": _ref_chain(1000)}}}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "tool_choice": "required",
                       "tools": [{"type": "function", "name": "f", "strict": True,
                                  "parameters": _ref_chain(1000)}]}),
    ("/v1/decisions/schema", {"context": "x", "mode": "batch", "schema": {
        "type": "object", "properties": {"deep": _ref_chain(1000)}}}),
    *(("/v1/chat/completions", _forced_tool({"type": "object", "properties": {
        "q": {"$ref": ref}}})) for ref in REMOTE_REFS),
    *(("/v1/chat/completions", _chat(response_format=_json_schema({
        "type": "object", "properties": {"q": {"$ref": ref}}}))) for ref in REMOTE_REFS[:3]),
    ("/v1/decisions/schema", {"context": "x", "mode": "sequential", "schema": _ref_bomb(30)}),
    ("/v1/decisions/schema", {"context": "x", "mode": "batch", "schema": {
        "type": "object", "properties": {"n": {
            "type": "number", "minimum": 0, "maximum": 1e300, "multipleOf": 1e-300}}}}),
    ("/v1/decisions/schema", {"context": "x", "mode": "batch", "schema": {
        "type": "object", "properties": {"n": {
            "type": "number", "minimum": -1e308, "maximum": 1e308, "x-step": 1e-308}}}}),
    ("/v1/systemone", {"state": "x" * 200_000, "questions": VALID["/v1/systemone"]["questions"]}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "input": "x" * 200_000}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "questions": [
        {"type": "predicate", "instructions": "x"}] * 400}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "questions": [
        {"type": "choice", "instructions": "x", "choices": [{"value": f"v{i}"}
                                                            for i in range(256)]}]}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "questions": [
        {"type": "predicate", "name": "n" * 500_000, "instructions": [
            {"type": "input_json", "data": json.loads('{"a":' * 60 + "1" + "}" * 60)}]}]}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "input": [
        {"type": "function_call_output", "call_id": "c" * 100_000, "output": "x"}]}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "x \ud800"}]}]}),
    ("/v1/decisions", {**VALID["/v1/decisions"], "prompt_cache_key": "k" * 100_000}),
    ("/v1/decisions", {"schema": json.loads("[" * 500 + "]" * 500)}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 10**12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "temperature": 1e308, "top_p": -0.0}),
    ("/v1/completions", {"prompt": [10**9, -1], "max_tokens": 1}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
    ("/v1/systemone", json.loads("[" * 500 + "]" * 500)),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 1, "seed": 10**5000, "logit_bias": {"9" * 5000: 1}}),
    ("/v1/responses", {"input": "hi \ud800", "instructions": "\udfff", "max_output_tokens": 1}),
]


@pytest.fixture(scope="module")
def client(engine):
    """The real app on the session model; generation capped at 4 tokens by default so a
    body that omits its limit stays within the time bound."""
    saved = engine._generator
    engine._generator = TextGenerator(engine.backend, max_input_tokens=engine.max_input_tokens,
                                      default_max_output_tokens=4)
    app = create_app(engine, ServerSettings(max_questions=16, request_deadline=30))
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c
    finally:
        engine._generator.scheduler.close()
        engine._generator = saved
        engine.scorer = None


def _dumps(body) -> str:
    """JSON text of ``body``, huge integers included (json.dumps refuses ints over 4,300 digits
    under Python's default limit, which is restored before the request is sent)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(body)
    finally:
        sys.set_int_max_str_digits(limit)


def _post(client, route: str, body) -> None:
    text = _dumps(body)
    start = time.monotonic()
    r = client.post(route, content=text, headers={"content-type": "application/json"})
    elapsed = time.monotonic() - start
    assert r.status_code < 500, (route, r.status_code, r.text[:500], text[:500])
    assert elapsed < SECONDS_PER_REQUEST, (route, elapsed, text[:500])
    if r.status_code >= 400:  # every refusal is the error envelope naming what went wrong
        assert r.json()["error"]["message"], r.text


def _alive(client) -> None:
    assert client.get("/health/live").status_code == 200
    r = client.post("/v1/systemone", json=VALID["/v1/systemone"])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route, body", DANGEROUS, ids=[r for r, _ in DANGEROUS])
def test_known_dangerous_bodies_are_refused_or_answered_quickly(client, route, body):
    _post(client, route, body)
    _alive(client)


FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(route=st.sampled_from(sorted(VALID)), body=json_values)
def test_arbitrary_json_never_gets_a_5xx(client, route, body):
    _post(client, route, body)


@FUZZ
@given(route=st.sampled_from(sorted(VALID)), data=st.data())
def test_one_field_replaced_never_gets_a_5xx(client, route, data):
    body = dict(VALID[route])
    key = data.draw(st.sampled_from(sorted(body) + ["model", "stream", "n", "seed", "stop"]))
    body[key] = data.draw(json_values)
    _post(client, route, body)


# schemas an attacker would send where a grammar or a validator reads one: reference chains of
# any length, references to anywhere, and ordinary values in between
hostile_schemas = st.one_of(
    st.integers(min_value=0, max_value=4000).map(_ref_chain),
    st.sampled_from(REMOTE_REFS).map(lambda ref: {"type": "object",
                                                  "properties": {"q": {"$ref": ref}}}),
    st.text(max_size=30).map(lambda ref: {"$ref": ref}),
    st.dictionaries(st.sampled_from(["type", "$ref", "$id", "$defs", "items", "anyOf"]),
                    json_values, max_size=4),
)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(where=st.sampled_from(["response_format", "tool", "text.format"]), schema=hostile_schemas)
def test_hostile_schemas_never_get_a_5xx(client, where, schema):
    if where == "response_format":
        _post(client, "/v1/chat/completions", _chat(response_format=_json_schema(schema)))
    elif where == "tool":
        _post(client, "/v1/chat/completions", _forced_tool(schema))
    else:
        _post(client, "/v1/responses", {"input": "hi", "max_output_tokens": 2, "text": {
            "format": {"type": "json_schema", "name": "x", "schema": schema}}})


def test_the_server_still_answers_after_the_fuzzing(client):
    for route in VALID:
        _post(client, route, VALID[route])
    _alive(client)
    assert client.get(f"/v1/responses/resp_{'0' * 24}").status_code == 404
