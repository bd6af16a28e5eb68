"""Tool ``parameters`` may only refer to themselves: every ``$ref`` that could leave the schema
(a URL, a file, a relative path, a URN, a rebasing ``$id``, a dynamic reference) is a 400 naming
it, and validating a call retrieves nothing even for a schema that skipped the check. Then a
real `onepass serve` with a loopback listener and a temp file: refused, never fetched, never
read, and validating a call does not hold the event loop. Last, what pydantic emits (local
``#/$defs/...``) is forced and validated end to end through the official `openai` SDK."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

from onepass.contract import ContractError
from onepass.generate import tools as T

pytest.importorskip("jsonschema")
SECRET = "SECRET-7f3a-NOT-FOR-CLIENTS"


class Address(BaseModel):
    city: str
    country: str


class Parcel(BaseModel):
    weight_kg: int
    kind: Literal["box", "letter"]


class Ship(BaseModel):
    """Ship parcels to an address."""

    to: Address
    parcel: Parcel
    express: bool = False


class Node(BaseModel):  # recursive: its schema refers to itself through $defs
    label: str
    children: list[Node] = []


def tool(parameters: dict, name: str = "f", strict: bool = True) -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": parameters,
                                              "strict": strict}}]


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


def refused(parameters: dict) -> ContractError:
    with pytest.raises(ContractError) as err:
        T.parse_tools(tool(parameters))
    return err.value


# --------------------------------------------------------------------------- the check

REMOTE = "http://127.0.0.1:9/x.json"
P = "tools[0].function.parameters"
HOSTILE = [
    (obj(x={"$ref": REMOTE}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": "https://example.invalid/s.json#/a"}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": "file:///etc/passwd"}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": "defs.json#/$defs/a"}), f"{P}.properties.x.$ref"),  # relative path
    (obj(x={"$ref": "/etc/hosts"}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": "//127.0.0.1:9/x"}), f"{P}.properties.x.$ref"),  # network-path reference
    (obj(x={"$ref": "urn:example:thing"}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": ""}), f"{P}.properties.x.$ref"),
    (obj(x={"$ref": "#thing"}), f"{P}.properties.x.$ref"),  # an anchor, not a pointer
    ({**obj(x={"$ref": "#/$defs/a"}), "$id": "http://127.0.0.1:9/", "$defs": {"a": {}}},
     f"{P}.$id"),  # rebasing the root: every '#' now means the remote document
    ({**obj(x={"$ref": "#/$defs/a"}), "$defs": {"a": {"$id": "file:///tmp/", "type": "string"}}},
     f"{P}.$defs.a.$id"),
    (obj(x={"$dynamicRef": "http://127.0.0.1:9/x#meta"}), f"{P}.properties.x.$dynamicRef"),
    (obj(x={"$recursiveRef": "#"}), f"{P}.properties.x.$recursiveRef"),
    ({**obj(), "$schema": "http://127.0.0.1:9/meta"}, f"{P}.$schema"),
    ({**obj(), "$schema": "http://json-schema.org/draft-04/schema#"}, f"{P}.$schema"),
    (obj(x={"anyOf": [{"type": "null"}, {"items": {"$ref": REMOTE}}]}),
     f"{P}.properties.x.anyOf[1].items.$ref"),
    ({**obj(x={"$ref": "#/$defs/a"}), "$defs": {"a": obj(y={"$ref": REMOTE})}},
     f"{P}.$defs.a.properties.y.$ref"),
    ({**obj(x={"$ref": "#/definitions/a"}), "definitions": {"a": {"allOf": [{"$ref": REMOTE}]}}},
     f"{P}.definitions.a.allOf[0].$ref"),
    (obj(x={"type": "array", "prefixItems": [{"not": {"$ref": REMOTE}}]}),
     f"{P}.properties.x.prefixItems[0].not.$ref"),
    (obj(x={"type": "object", "patternProperties": {"^a": {"$ref": REMOTE}}}),
     f"{P}.properties.x.patternProperties.^a.$ref"),
    ({**obj(), "additionalProperties": {"$ref": REMOTE}}, f"{P}.additionalProperties.$ref"),
    # a pointer can reach anywhere, so a remote reference hidden in data is refused too
    ({**obj(x={"$ref": "#/x-hidden/0"}), "x-hidden": [{"$ref": REMOTE}]},
     f"{P}.x-hidden[0].$ref"),
    (obj(x={"$ref": "#/$defs/missing"}), f"{P}.properties.x.$ref"),
    ({**obj(x={"$ref": "#/required/0"}), "required": ["x"]}, f"{P}.properties.x.$ref"),
]


@pytest.mark.parametrize("parameters, field", HOSTILE, ids=[f for _, f in HOSTILE])
def test_every_non_local_reference_is_refused_naming_it(parameters, field):
    err = refused(parameters)
    assert err.field == field, err
    assert "$" in err.message or "dialect" in err.message


def test_the_responses_dialect_names_its_own_path():
    with pytest.raises(ContractError) as err:
        T.parse_tools([{"type": "function", "name": "f", "parameters": obj(x={"$ref": REMOTE})}],
                      dialect="responses")
    assert err.value.field == "tools[0].parameters.properties.x.$ref"


LOCAL = [
    Ship.model_json_schema(),  # $defs, nested
    {**obj(x={"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}),
     "$defs": {"a": {"type": "integer"}}},
    Node.model_json_schema(),  # a root $ref and recursion
    {**obj(x={"$ref": "#/definitions/a"}), "definitions": {"a": {"type": "integer"}}},
    {**obj(x={"$ref": "#/$defs/a%20b"}, y={"$ref": "#/$defs/c~1d"}),
     "$defs": {"a b": {"type": "string"}, "c/d": {"type": "integer"}}},
    {**obj(x={"$ref": "#"}), "$schema": "https://json-schema.org/draft/2020-12/schema"},
    {**obj(x={"$ref": "#/properties/y"}, y={"type": "boolean"})},
    {**obj(x={"$ref": "#/$defs/a"}), "$defs": {"a": True}},
    obj(x={"const": {"$ref": "#"}}, y={"enum": ["$ref", "$id"]}),  # data that looks like keys
    obj(**{"$ref": {"type": "string"}, "$id": {"type": "integer"}}),  # properties named so
]


@pytest.mark.parametrize("parameters", LOCAL)
def test_local_pointers_are_accepted(parameters):
    (fn,) = T.parse_tools(tool(parameters))
    assert fn.parameters == parameters


class Listener:
    """A loopback HTTP server that records every request and answers a JSON schema holding
    :data:`SECRET`, sometimes slowly."""

    def __init__(self) -> None:
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                hits.append(self.path)
                body = json.dumps({"enum": [SECRET]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def listener():
    found = Listener()
    yield found
    found.close()


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("refs") / "secret.json"
    path.write_text(json.dumps({"enum": [SECRET]}))
    return path


def test_validating_a_call_never_retrieves_even_past_the_check(listener, secret_file):
    """Defence in depth: a Function built without the check (the validator alone) still
    fetches nothing and reads nothing; the call is refused without the content."""
    for ref in (f"{listener.url}/deep.json", secret_file.as_uri(), "http://127.0.0.1:1/x"):
        fn = T.Function("f", None, obj(x={"$ref": ref}), True)
        spec = T.ToolSpec((fn,), "auto", None, True)
        with pytest.raises(T.MalformedCall) as err:
            T.parse_calls('<tool_call>\n{"name": "f", "arguments": {"x": 4}}\n</tool_call>',
                          spec)
        assert SECRET not in str(err.value) and "does not resolve" in str(err.value)
    assert listener.hits == []


def test_forced_call_wrapper_keeps_local_pointers_valid():
    """The wrapper embeds each function's parameters as a resource of their own, so
    ``#/$defs/...`` resolves inside them (two functions may both name a $defs entry)."""
    tools = tool(Ship.model_json_schema(), "ship") + tool(Node.model_json_schema(), "tree")
    spec = T.parse_tool_request(tools, "required", False)
    body = json.loads(T.call_grammar(spec).split("%json ", 1)[1])
    for variant in body["anyOf"]:
        args = variant["properties"]["arguments"]
        assert args["$id"] == "urn:onepass:tool:" + variant["properties"]["name"]["const"]
        assert "$defs" in args


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(server + "/v1/models", timeout=30).json()["data"][0]["id"]


def few_shot(calls: int = 1) -> list[dict]:
    """Three earlier turns where the assistant called f ``calls`` times with {"x": i}:
    SmolLM2 then calls it again (so an ``auto`` turn reaches call validation)."""
    messages: list[dict] = []
    for i in range(1, 4):
        made = [{"id": f"c{i}_{j}", "type": "function",
                 "function": {"name": "f", "arguments": json.dumps({"x": i * 10 + j})}}
                for j in range(calls)]
        messages += [{"role": "user", "content": "Call f."},
                     {"role": "assistant", "content": None, "tool_calls": made}]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in made]
        messages += [{"role": "assistant", "content": "Done."}]
    return messages + [{"role": "user", "content": "Call f."}]


def test_remote_and_file_refs_are_400s_never_fetched_or_read(server, model, listener,
                                                             secret_file):
    refs = [f"{listener.url}/x.json", secret_file.as_uri(), "http://127.0.0.1:1/closed.json",
            secret_file.name]
    chat_choices = ["auto", "required", {"type": "function", "function": {"name": "f"}}]
    with httpx.Client(base_url=server, timeout=120) as http:
        for ref in refs:
            parameters = {**obj(x={"$ref": ref}), "required": ["x"]}
            for choice in chat_choices:
                r = http.post("/v1/chat/completions", json={
                    "model": model, "messages": few_shot(), "tools": tool(parameters),
                    "tool_choice": choice, "max_tokens": 40, "temperature": 0})
                assert r.status_code == 400, (ref, choice, r.text)
                assert r.json()["error"]["param"] == f"{P}.properties.x.$ref", r.text
                assert SECRET not in r.text
            for choice in ("auto", "required"):
                r = http.post("/v1/responses", json={
                    "model": model, "input": "Call f.", "tool_choice": choice,
                    "tools": [{"type": "function", "name": "f", "parameters": parameters,
                               "strict": True}], "max_output_tokens": 40})
                assert r.status_code == 400, (ref, choice, r.text)
                assert r.json()["error"]["param"] == "tools[0].parameters.properties.x.$ref"
                assert SECRET not in r.text
            # structured output (llguidance resolves references; its retriever fetches nothing)
            schema = {**obj(x={"$ref": ref}), "required": ["x"]}
            r = http.post("/v1/chat/completions", json={
                "model": model, "messages": few_shot(), "max_tokens": 20,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "s", "schema": schema}}})
            assert r.status_code == 400 and SECRET not in r.text, r.text
            assert r.json()["error"]["param"] == "response_format.json_schema.schema"
            r = http.post("/v1/responses", json={
                "model": model, "input": "x", "max_output_tokens": 20,
                "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}})
            assert r.status_code == 400 and SECRET not in r.text, r.text
            assert r.json()["error"]["param"] == "text.format.schema"
    assert listener.hits == []


def fan_out(depth: int) -> dict:
    """Parameters whose references fan out: 2^depth integer checks per call, in ~50 bytes
    per level."""
    defs: dict = {"a0": {"type": "integer"}}
    for i in range(1, depth + 1):
        defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i - 1}"}] * 2}
    return {**obj(x={"$ref": f"#/$defs/a{depth}"}), "required": ["x"], "$defs": defs}


def test_references_that_fan_out_are_bounded():
    (fn,) = T.parse_tools(tool(fan_out(12)))  # 4,096 checks a call: legal
    for depth in (13, 40):
        err = refused(fan_out(depth))
        assert err.field == P and "expand to over" in err.message, err
    hidden = fan_out(40)  # under a property named like a data keyword: still counted
    hidden["properties"] = {"default": hidden["properties"]["x"]}
    assert "expand to over" in refused(hidden).message


def test_validating_a_call_does_not_hold_the_event_loop(engine, monkeypatch):
    """Parsing and validating the model's calls runs in a worker thread: made slow (1.5 s,
    the one stand-in here; the generation and the validation are real), /health/live keeps
    answering meanwhile. In-process on the session engine: one event loop, two clients."""
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    real, entered = T.parse_calls, threading.Event()

    def slow_parse(*args, **kwargs):
        entered.set()
        time.sleep(1.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(T, "parse_calls", slow_parse)
    out: dict = {}
    with TestClient(create_app(engine, ServerSettings())) as http:
        def ask() -> None:
            out["r"] = http.post("/v1/chat/completions", json={
                "model": engine.served_name, "messages": few_shot(),
                "tools": tool(fan_out(12)), "max_tokens": 40, "temperature": 0})

        worker = threading.Thread(target=ask)
        worker.start()
        assert entered.wait(120), "the model made no call"
        began = time.monotonic()
        assert http.get("/health/live").status_code == 200
        waited = time.monotonic() - began
        worker.join()
    r = out["r"]
    assert r.status_code == 200, r.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]  # validated, not skipped
    assert isinstance(json.loads(call["function"]["arguments"])["x"], int)
    assert waited < 1.0, f"/health/live took {waited:.2f} s while a call was validated"


def test_pydantic_defs_forced_call_through_the_openai_sdk(server, model):
    """What `openai.pydantic_function_tool` sends (local #/$defs pointers, strict) is forced
    and comes back parsed into the model by the SDK, for a named function and required."""
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    client = openai.OpenAI(base_url=server + "/v1", api_key="local", timeout=120,
                           max_retries=0)
    ask = [{"role": "user", "content": "Ship a 3 kg box to Paris, France."}]
    sent = openai.pydantic_function_tool(Ship)
    assert "$defs" in sent["function"]["parameters"]
    for tools, choice in (([sent, openai.pydantic_function_tool(Node)],
                           {"type": "function", "function": {"name": "Ship"}}),
                          ([sent], "required")):
        out = client.chat.completions.parse(
            model=model, messages=ask, tools=tools, tool_choice=choice,
            parallel_tool_calls=False, max_tokens=120, temperature=0)
        assert out.choices[0].finish_reason == "tool_calls", out
        (call,) = out.choices[0].message.tool_calls
        assert call.function.name == "Ship"
        jsonschema.validate(json.loads(call.function.arguments), sent["function"]["parameters"])
        assert isinstance(call.function.parsed_arguments, Ship), call
