"""Hostile grammars (issue 25, items 2 and 3): a grammar deep or large enough to overflow
llguidance's native stack is a 400 naming the field, never a crash of the server; a grammar the
parser cannot follow is refused when it compiles, and one that fails mid-sequence ends only its
own sequence while every other sequence and decision in the same steps goes on.

Whatever could crash natively runs in a subprocess or a real `onepass serve`, never in pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from onepass.contract import ContractError
from onepass.generate.grammar import (
    LIMITS,
    GrammarError,
    GrammarLimits,
    check_grammar_bounds,
    check_schema_bounds,
    compile_grammar,
    tokenizer_info,
)
from onepass.generate.sampling import SamplingParams

TOO_BIG = "too large or too deep to compile safely"


def ref_chain(n: int) -> dict:
    """``n`` object definitions, each one's property a ``$ref`` to the next (~85 B a link)."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def lark_chain(n: int) -> str:
    """``n`` Lark rules, each one's body the next rule (~30 B a rule)."""
    return "\n".join(["start: r0", *(f'r{i}: "a" r{i + 1}' for i in range(n)), f'r{n}: "b"'])


def alternatives(n: int) -> str:
    """One rule of ``n`` alternatives: over 2,000 meets llguidance's row limit."""
    return " | ".join(f'"w{i}x"' for i in range(n))


# a grammar that compiles and passes the compile-time probe, then meets the row limit once
# the model has written its twelve letters: a fault in the middle of a sequence
LATE_FAULT = "start: /[a-z]{12}/ alts\nalts: " + alternatives(2100)


# --------------------------------------------------------------------------- bounds (pure)


def test_a_deep_ref_chain_is_refused_naming_the_field_before_compiling():
    with pytest.raises(ContractError) as err:
        check_schema_bounds(ref_chain(1000), "response_format.json_schema.schema")
    assert err.value.field == "response_format.json_schema.schema"
    assert TOO_BIG in err.value.message and "deeper than 128 levels" in err.value.message


def test_every_ref_hop_counts_and_a_cycle_counts_once():
    limits = GrammarLimits(max_depth=12)
    check_schema_bounds(ref_chain(3), "f", limits)  # 3 links: 3 levels each, under 12
    with pytest.raises(ContractError):
        check_schema_bounds(ref_chain(4), "f", limits)
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    check_schema_bounds(tree, "f", limits)  # recursive, not deep: the compiler makes one rule


def test_references_through_anchors_and_ids_are_followed():
    defs = {f"d{i}": {"$anchor": f"a{i}", "type": "object",
                      "properties": {"x": {"$ref": f"#a{i + 1}"}}} for i in range(200)}
    defs["d200"] = {"$anchor": "a200", "type": "string"}
    with pytest.raises(ContractError, match="deeper than"):
        check_schema_bounds({"$ref": "#a0", "$defs": defs}, "f")
    ids = {f"d{i}": {"$id": f"urn:x:{i}", "type": "object",
                     "properties": {"x": {"$ref": f"urn:x:{i + 1}"}}} for i in range(200)}
    with pytest.raises(ContractError, match="deeper than"):
        check_schema_bounds({"$ref": "urn:x:0", "$defs": ids}, "f")


def test_ordinary_schemas_pass_the_bounds():
    nested: dict = {"type": "string"}
    for _ in range(10):  # ten nested pydantic-style models, each behind a $ref
        nested = {"type": "object", "properties": {"inner": nested, "tags": {
            "type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}
    check_schema_bounds(nested, "f")
    check_schema_bounds(ref_chain(30), "f")
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}
    check_schema_bounds(wide, "f")


def test_a_lark_rule_chain_is_refused_by_rule_count():
    with pytest.raises(ContractError) as err:
        check_grammar_bounds(lark_chain(3000), "grammar")
    assert err.value.field == "grammar"
    assert TOO_BIG in err.value.message and "3,002 rules" in err.value.message
    check_grammar_bounds(lark_chain(900), "grammar")


def test_size_is_bounded_for_grammars_and_schemas():
    big = 'start: "' + "a" * LIMITS.max_chars + '"'
    with pytest.raises(ContractError, match="characters"):
        check_grammar_bounds(big, "grammar")
    with pytest.raises(ContractError, match="characters"):
        check_schema_bounds({"enum": ["x" * 1000] * 300}, "text.format.schema")


def test_a_schema_embedded_in_a_grammar_is_bounded_too():
    """The forced-tool grammar is made of ``%json`` blocks: a chain inside one is refused."""
    lark = f"start: %json {json.dumps(ref_chain(1000))}\n"
    with pytest.raises(ContractError, match="deeper than"):
        check_grammar_bounds(lark, "tools")


def test_tool_parameters_are_bounded_where_they_are_read():
    from onepass.generate.tools import parse_tools

    chat = [{"type": "function", "function": {"name": "f", "parameters": ref_chain(1000)}}]
    with pytest.raises(ContractError) as err:
        parse_tools(chat)
    assert err.value.field == "tools[0].function.parameters"
    responses = [{"type": "function", "name": "f", "parameters": ref_chain(1000)}]
    with pytest.raises(ContractError) as err:
        parse_tools(responses, dialect="responses")
    assert err.value.field == "tools[0].parameters"


# --------------------------------------------------------------------------- native compiles

_COMPILE = r"""
import json, sys
from transformers import AutoTokenizer
from onepass.generate import grammar as G
sys.path.insert(0, {tests!r})
from test_grammar_hostile import lark_chain, ref_chain
info = G.TokenizerInfo(AutoTokenizer.from_pretrained({path!r}), {vocab}, {eos})
for name, kind, source in (("chain", "json_schema", json.dumps(ref_chain(1000))),
                           ("rules", "grammar", lark_chain(3000))):
    # past the bounds, straight to the compile thread: its stack holds them
    G._COMPILER.run(lambda: G._compile(info, kind, source, "f"))
    print(name, "compiled", flush=True)
for shape in ({{"json_schema": ref_chain(1000)}}, {{"grammar": lark_chain(3000)}}):
    try:
        G.compile_grammar(info, **shape, field="f")
    except G.ContractError as exc:
        print("refused", exc.field, flush=True)
"""


def test_the_compile_thread_holds_what_overflows_a_default_stack(engine):
    """Before: these two shapes killed the process (SIGSEGV, a stack overflow in llguidance);
    on the compile thread they compile, and through :func:`compile_grammar` they are refused
    by the bounds before llguidance sees them."""
    from pathlib import Path

    backend = engine.backend
    code = _COMPILE.format(tests=str(Path(__file__).parent), path=backend.tokenizer.name_or_path,
                           vocab=backend.vocab_size, eos=sorted(backend.eos_ids))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split("\n")[:4] == ["chain compiled", "rules compiled", "refused f",
                                            "refused f"]


def test_a_grammar_past_the_row_limit_is_refused_when_it_compiles(engine):
    info = tokenizer_info(engine.backend)
    with pytest.raises(ContractError) as err:
        compile_grammar(info, grammar="start: " + alternatives(2100), field="grammar")
    assert err.value.field == "grammar" and "2101 items" in err.value.message
    assert len(err.value.message) < 700  # terse: never the whole grammar and parser state
    compile_grammar(info, grammar="start: " + alternatives(1900), field="grammar")
    late = compile_grammar(info, grammar=LATE_FAULT, field="grammar")  # the probe passes it
    matcher = late.matcher()
    with pytest.raises(GrammarError) as fault:
        for token in info.token_ids("abcdefghijklw1x"):
            matcher.accept(token)
    assert fault.value.field == "grammar"


# --------------------------------------------------------------------------- one sequence's fault

GREEDY = SamplingParams(temperature=0.0)


def test_a_grammar_fault_mid_sequence_ends_only_its_own_sequence(engine):
    """Before: the fault (raised by the matcher's consume) reached the step loop's catch-all,
    which ended every active sequence and decision with an error. Now the faulty sequence ends
    with its GrammarError; the others finish exactly as they do alone."""
    from onepass.generate.scheduler import GenerationScheduler

    backend = engine.backend
    scheduler = GenerationScheduler(backend, arena_rows=4096)
    info = tokenizer_info(backend)
    late = compile_grammar(info, grammar=LATE_FAULT, field="grammar")
    prompts = [engine.generator.chat_prompt([{"role": "user", "content": text}])
               for text in ("Write twelve lowercase letters.", "Tell me about rivers.",
                            "Name three colours.")]
    prefix = backend.encode("Question: is the sky blue? Answer:")
    suffixes = [backend.encode(" yes or no?", bos=False)]
    candidates = [[backend.encode(w, bos=False)[0] for w in (" yes", " no")]]
    try:
        alone = ["".join(e.text for e in scheduler.submit(p, GREEDY, 24) if hasattr(e, "text"))
                 for p in prompts[1:]]
        solo_decision = scheduler.score(prefix, suffixes, candidates).logits
        decisions: list = []
        stop = threading.Event()

        def decide() -> None:
            while not stop.is_set():
                try:
                    decisions.append(scheduler.score(prefix, suffixes, candidates).logits)
                except Exception as exc:  # recorded: the test asserts there is none
                    decisions.append(exc)

        thread = threading.Thread(target=decide, daemon=True)
        thread.start()
        time.sleep(0.2)
        streams = [scheduler.submit(prompts[0], GREEDY, 24, grammar=late),
                   *(scheduler.submit(p, GREEDY, 24) for p in prompts[1:])]
        events = [list(s) for s in streams]
        stop.set()
        thread.join(60)
    finally:
        scheduler.close()
    faulty = events[0][-1]
    assert faulty.reason == "error" and isinstance(faulty.error, GrammarError)
    assert faulty.error.field == "grammar" and "2101 items" in str(faulty.error)
    for got, want in zip(events[1:], alone):
        assert got[-1].reason == "length" and got[-1].error is None
        assert "".join(e.text for e in got[:-1]) == want
    assert decisions and not [d for d in decisions if isinstance(d, Exception)]
    for logits in decisions:
        assert logits[0] == pytest.approx(solo_decision[0], abs=1e-3)


# --------------------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(server + "/v1/models", timeout=30).json()["data"][0]["id"]


def _still_serving(server: str, model: str) -> None:
    assert httpx.get(server + "/health/live", timeout=10).status_code == 200
    r = httpx.post(server + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3})
    assert r.status_code == 200, r.text


def _chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Answer."}],
            "max_tokens": 8, **extra}


def _chain_tool(dialect: str) -> dict:
    if dialect == "chat":
        return {"type": "function", "function": {"name": "f", "parameters": ref_chain(1000)}}
    return {"type": "function", "name": "f", "parameters": ref_chain(1000)}


def _cases(model: str) -> list[tuple[str, str, dict, str]]:
    chain_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": ref_chain(1000)}}
    deep = {"properties": {"code": {"type": "string", "x-open": True,
                                    "pattern": "^(" + "a|" * 140_000 + "b)$",
                                    "description": "What is the code?"}}}
    return [
        ("chat response_format", "/v1/chat/completions",
         _chat(model, response_format=chain_format), "response_format.json_schema.schema"),
        ("chat grammar", "/v1/chat/completions", _chat(model, grammar=lark_chain(3000)),
         "grammar"),
        ("chat row limit", "/v1/chat/completions",
         _chat(model, grammar="start: " + alternatives(2100)), "grammar"),
        ("completions grammar", "/v1/completions",
         {"model": model, "prompt": "Answer:", "max_tokens": 8, "grammar": lark_chain(3000)},
         "grammar"),
        ("chat forced tool", "/v1/chat/completions",
         _chat(model, tools=[_chain_tool("chat")], tool_choice="required"),
         "tools[0].function.parameters"),
        ("responses text.format", "/v1/responses",
         {"model": model, "input": "Answer.", "max_output_tokens": 8, "text": {"format": {
             "type": "json_schema", "name": "x", "schema": ref_chain(1000)}}},
         "text.format.schema"),
        ("responses forced tool", "/v1/responses",
         {"model": model, "input": "Answer.", "max_output_tokens": 8,
          "tools": [_chain_tool("responses")], "tool_choice": "required"},
         "tools[0].parameters"),
        ("decisions open field", "/v1/decisions/schema",
         {"context": "Invoice ABC.", "mode": "batch", "schema": deep},
         "schema.properties.code"),
    ]


def test_every_crashing_shape_is_a_400_naming_the_field_on_every_route(server, model):
    """Before: the first of these killed the server (SIGSEGV); now each is a 400 naming its
    field, and the server answers /health/live and a chat afterwards."""
    for name, path, body, field in _cases(model):
        r = httpx.post(server + path, json=body, timeout=120)
        assert r.status_code == 400, (name, r.status_code, r.text[:500])
        error = r.json()["error"]
        assert error["field"] == field, (name, error)
        _still_serving(server, model)


def test_a_late_grammar_fault_is_a_400_for_its_request_only(server, model):
    """A grammar that fails mid-sequence answers 400 for its own request (and an error event
    when streamed) while chats and decisions running beside it complete normally."""
    results: dict[str, httpx.Response] = {}

    def post(key: str, path: str, body: dict) -> None:
        results[key] = httpx.post(server + path, json=body, timeout=180)

    jobs = {
        "late": ("/v1/chat/completions", {
            "model": model, "max_tokens": 24, "grammar": LATE_FAULT,
            "messages": [{"role": "user", "content": "Write twelve lowercase letters."}]}),
        "chat": ("/v1/chat/completions", {
            "model": model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me about rivers."}]}),
        "decision": ("/v1/decisions/schema", {
            "context": "The sky is blue.", "mode": "batch",
            "schema": {"properties": {"blue": {"type": "boolean",
                                               "description": "Is the sky blue?"}}}}),
    }
    threads = [threading.Thread(target=post, args=(k, *v)) for k, v in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    late = results["late"]
    assert late.status_code == 400, late.text[:500]
    assert late.json()["error"]["field"] == "grammar"
    assert "cannot be followed" in late.json()["error"]["message"]
    assert results["chat"].status_code == 200, results["chat"].text[:500]
    assert results["chat"].json()["choices"][0]["finish_reason"] == "length"
    assert results["decision"].status_code == 200, results["decision"].text[:500]
    assert isinstance(results["decision"].json()["value"]["blue"], bool)
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=180, json={
            **jobs["late"][1], "stream": True}) as streamed:
        assert streamed.status_code == 200
        text = "".join(streamed.iter_text())
    assert "cannot be followed" in text and '"error"' in text
    _still_serving(server, model)
