"""A tool's ``pattern`` is the client's regular expression, and the server matches it against
the model's arguments when it validates a strict call. Python's ``re`` backtracks without a
bound and holds the GIL while it does: ``^(a|a)*$`` against ``"a" * 22 + "!"`` took 0.9 s,
doubling per character, and froze every thread of the server. Calls are now matched with
``regex`` under a timeout (the GIL released), a pattern too slow for the model's argument is a
400 naming it, and patterns that are too long, unreadable or that unroll into too much to
compile are refused when the request is parsed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from onepass.contract import ContractError
from onepass.generate import tools as T

pytest.importorskip("jsonschema")
P = "tools[0].function.parameters"
EVIL = "^(a|a)*$"


def tool(parameters: dict, name: str = "f") -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": parameters,
                                              "strict": True}}]


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


def spec_of(parameters: dict) -> T.ToolSpec:
    spec = T.parse_tool_request(tool(parameters), "auto", True)
    assert spec is not None
    return spec


def call(arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": "f", "arguments": arguments}) + "\n</tool_call>"


def refused(parameters: dict) -> ContractError:
    with pytest.raises(ContractError) as err:
        T.parse_tools(tool(parameters))
    return err.value


# --------------------------------------------------------------------------- matching

PROBE = textwrap.dedent("""
    import json, threading, time
    from onepass.generate import tools as T

    spec = T.parse_tool_request([{"type": "function", "function": {"name": "f", "strict": True,
        "parameters": {"type": "object", "properties": {"x": {"type": "string",
        "pattern": "^(a|a)*$"}}, "required": ["x"]}}}], "auto", True)
    text = '<tool_call>\\n{"name": "f", "arguments": {"x": "' + "a" * 40 + '!"}}\\n</tool_call>'
    count, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            count[0] += 1

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(0.2)
    before, began = count[0], time.monotonic()
    time.sleep(0.2)
    idle_rate = (count[0] - before) / (time.monotonic() - began)
    out = {}

    def validate():
        try:
            T.parse_calls(text, spec)
            out["error"] = None
        except Exception as exc:
            out["error"] = [type(exc).__name__, getattr(exc, "field", None), str(exc)]

    worker = threading.Thread(target=validate)
    before, began = count[0], time.monotonic()
    worker.start()
    worker.join()
    took = time.monotonic() - began
    out.update(seconds=took, rate=(count[0] - before) / took, idle_rate=idle_rate)
    stop.set()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probe() -> dict:
    """Validating a 41-character adversarial argument in a worker thread while another
    thread counts, in a subprocess: before the fix that match never ends (and holds the GIL,
    so nothing in the process could even time it out)."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("validating the call against ^(a|a)*$ did not finish within 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_backtracking_pattern_fails_the_call_within_a_second_naming_it(probe):
    assert probe["seconds"] < 1.0, probe
    kind, field, message = probe["error"]
    assert kind == "ContractError" and field == f"{P}.properties.x.pattern", probe
    assert EVIL in message and "time" in message


def test_other_threads_keep_running_while_a_pattern_is_matched(probe):
    """The GIL is released while matching: the counting thread advances at a good part of
    its idle rate (Python's re held it: ~1% of it)."""
    assert probe["rate"] > 0.15 * probe["idle_rate"], probe


SLOW = "a" * 22 + "!"  # ~1 s for Python's re, 0.1 s (the timeout) now


@pytest.mark.parametrize("parameters, arguments, field", [
    (obj(x={"type": "object", "patternProperties": {EVIL: {}}}), {"x": {SLOW: 1}},
     f"{P}.properties.x.patternProperties.{EVIL}"),
    ({**obj(), "patternProperties": {"^b": {}, EVIL: {"type": "integer"}},
      "additionalProperties": False}, {SLOW: 1}, f"{P}.patternProperties.{EVIL}"),
    ({**obj(), "patternProperties": {EVIL: {}}, "additionalProperties": {"type": "string"}},
     {SLOW: "s"}, f"{P}.patternProperties.{EVIL}"),
    (obj(x={"type": "object", "propertyNames": {"pattern": EVIL}}), {"x": {SLOW: 1}},
     f"{P}.properties.x.propertyNames.pattern"),
    (obj(x={"not": {"pattern": EVIL}}), {"x": SLOW}, f"{P}.properties.x.not.pattern"),
    (obj(x={"anyOf": [{"type": "integer"}, {"pattern": EVIL}]}), {"x": SLOW},
     f"{P}.properties.x.anyOf[1].pattern"),
    ({**obj(x={"$ref": "#/$defs/s"}), "$defs": {"s": {"type": "string", "pattern": EVIL}}},
     {"x": SLOW}, f"{P}.$defs.s.pattern"),
])
def test_every_place_a_pattern_is_matched_is_bounded(parameters, arguments, field):
    """Keys and values, inside not/anyOf/$ref (where a failed match would otherwise be
    read as a result): each is a ContractError naming the pattern."""
    with pytest.raises(ContractError) as err:
        T.parse_calls(call(arguments), spec_of(parameters))
    assert err.value.field == field, err.value


def test_the_responses_dialect_names_its_own_path():
    (fn,) = T.parse_tools([{"type": "function", "name": "f", "strict": True,
                            "parameters": obj(x={"type": "string", "pattern": EVIL})}],
                          dialect="responses")
    with pytest.raises(ContractError) as err:
        T.parse_calls(call({"x": SLOW}), T.ToolSpec((fn,), "auto", None, True))
    assert err.value.field == "tools[0].parameters.properties.x.pattern"


def test_format_regex_is_an_annotation_so_no_argument_is_compiled():
    """``format`` is not asserted when calls are validated: an argument under
    ``format: regex`` is never compiled (the only patterns compiled are the schema's)."""
    spec = spec_of(obj(x={"type": "string", "format": "regex"}))
    assert T.parse_calls(call({"x": "(?:a{1000}){1000}("}), spec)[1]


def test_ordinary_patterns_still_decide_calls():
    spec = spec_of({**obj(code={"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}),
                    "patternProperties": {"^tag_": {"type": "string"}},
                    "additionalProperties": False, "required": ["code"]})
    assert T.parse_calls(call({"code": "ABC-12", "tag_a": "x"}), spec)[1]
    with pytest.raises(T.MalformedCall, match="does not match"):
        T.parse_calls(call({"code": "abc-12"}), spec)
    with pytest.raises(T.MalformedCall, match="not match any of the regexes"):
        T.parse_calls(call({"code": "ABC-12", "other": 1}), spec)
    with pytest.raises(T.MalformedCall, match="is not of type 'string'"):
        T.parse_calls(call({"code": "ABC-12", "tag_b": 3}), spec)
    loose = spec_of({**obj(), "patternProperties": {"^n_": {"type": "integer"}},
                     "additionalProperties": {"type": "boolean"}})
    assert T.parse_calls(call({"n_1": 2, "flag": True}), loose)[1]
    with pytest.raises(T.MalformedCall, match="is not of type 'boolean'"):
        T.parse_calls(call({"flag": 2}), loose)


def test_the_route_answers_a_slow_pattern_with_a_400_naming_it():
    """settle_tools (what every generation route calls on a finished reply) turns it into
    the tools' 400, an ApiError, so a stream reports it as it is, not as a 500."""
    from onepass.server import generation_serving as R
    from onepass.server import openai as W
    from onepass.server.errors import ApiError

    choice = W.Choice(text=call({"x": SLOW}), finish_reason="stop")
    with pytest.raises(ApiError) as err:
        R.settle_tools(choice, spec_of(obj(x={"type": "string", "pattern": EVIL})), "hermes")
    assert err.value.status == 400 and err.value.field == f"{P}.properties.x.pattern"


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("parameters, field, words", [
    (obj(x={"type": "string", "pattern": "a" * 1001}), f"{P}.properties.x.pattern",
     "over the limit of 1,000"),
    (obj(x={"type": "string", "pattern": "(a"}), f"{P}.properties.x.pattern",
     "not a regular expression"),
    (obj(x={"type": "object", "patternProperties": {"[a": {}}}),
     f"{P}.properties.x.patternProperties.[a", "not a regular expression"),
    (obj(x={"type": "object", "patternProperties": {"b" * 1001: {}}}),
     f"{P}.properties.x.patternProperties", "over the limit"),
    # the regex module unrolls counted repeats: 17 characters, 0.9 s and 270 MB to compile
    (obj(x={"type": "string", "pattern": "(?:a{1000}){1000}"}), f"{P}.properties.x.pattern",
     "expand to over"),
    (obj(x={"type": "string", "pattern": "a{65535}" * 100}), f"{P}.properties.x.pattern",
     "expand to over"),
    (obj(x={"type": "string", "pattern": "(?:" * 20 + "a" + "){2}" * 20}),
     f"{P}.properties.x.pattern", "expand to over"),
    ({**obj(), "patternProperties": {"^a": {}}, "unevaluatedProperties": False},
     f"{P}.unevaluatedProperties", "patternProperties"),
])
def test_patterns_that_cannot_be_matched_safely_are_refused_naming_them(parameters, field,
                                                                        words):
    err = refused(parameters)
    assert err.field == field and words in err.message, err


def test_the_compile_budget_is_shared_by_a_requests_tools():
    heavy = obj(x={"type": "string", "pattern": "^a{9000}$"})
    T.parse_tools(tool(heavy) + tool(heavy, "g"))  # 18,004 parts: legal
    with pytest.raises(ContractError) as err:
        T.parse_tools(tool(heavy) + tool(heavy, "g") + tool(heavy, "h"))
    assert err.value.field == "tools[2].function.parameters.properties.x.pattern"
    assert "expand to over 20,000" in err.value.message


def test_ordinary_patterns_are_accepted():
    for pattern in ("^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$", "^\\d{4}-\\d{2}-\\d{2}$",
                    "^(?!\\s*$).+", "^[A-Za-z_][A-Za-z0-9_]{0,63}$", "(?i)^yes|no$"):
        T.parse_tools(tool(obj(x={"type": "string", "pattern": pattern})))
    T.parse_tools(tool({**obj(), "unevaluatedProperties": False}))  # without patterns: fine


# --------------------------------------------------------------------------- over HTTP


def copied_calls(argument: str) -> list[dict]:
    """Three earlier turns where the user asked for f with ``x = argument`` and the assistant
    called it so: SmolLM2 then does it again, so an ``auto`` turn reaches call validation."""
    ask = f"Call f with x = {argument}"
    messages: list[dict] = []
    for i in range(3):
        made = {"id": f"c{i}", "type": "function",
                "function": {"name": "f", "arguments": json.dumps({"x": argument})}}
        messages += [{"role": "user", "content": ask},
                     {"role": "assistant", "content": None, "tool_calls": [made]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
                     {"role": "assistant", "content": "Done."}]
    return messages + [{"role": "user", "content": ask}]


def test_a_real_call_against_a_slow_pattern_is_a_400_plain_and_streamed(engine):
    """The model writes the argument (few-shot), the route validates it: a 400 naming the
    pattern (a 502 'does not match' after ~1 s with Python's re, and with a longer argument
    a server that never answers again), and /health/live answers; streamed, the same error
    as the stream's error event, not a 500."""
    from fastapi.testclient import TestClient

    from onepass.server import ServerSettings, create_app

    body = {"model": engine.served_name, "messages": copied_calls(SLOW), "max_tokens": 60,
            "temperature": 0, "tools": tool(obj(x={"type": "string", "pattern": EVIL}))}
    with TestClient(create_app(engine, ServerSettings())) as http:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == f"{P}.properties.x.pattern", r.text
        assert http.get("/health/live").status_code == 200
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            frames = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: {")]
    error = frames[-1]["error"]
    assert error["code"] == 400 and f"{P}.properties.x.pattern" in error["message"], frames
