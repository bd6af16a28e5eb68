"""Schema decisions on the real embedded model: cache reuse proven, both modes against naive
recomputation, sampling, the open branch, the wire and the CLI."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from onepass import prompt as P
from onepass.contract import ContractError
from onepass.readout import restricted_softmax
from onepass.schema import (
    ESCAPE_KEY,
    _string_end,
    compile_schema,
    extend_schema,
    parse_decisions,
    read_json_string,
    record_text,
    run_plan,
)
from onepass.schema import decide as runner  # the module that reads the clock

pytestmark = pytest.mark.usefixtures("library_path")  # the CLI's and Python's path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two cores shared with other jobs: more than one intra-op thread thrashes (10x slower)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)



CONTEXT = "Taxi from the airport to the hotel, 42 EUR, paid personally; the receipt is missing."

SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"enum": ["meal", "travel", "equipment"],
                     "description": "What kind of expense is this?"},
        "refund": {"type": "boolean", "description": "Should it be refunded?"},
        "review": {
            "type": "object",
            "properties": {
                "risk": {"type": "integer", "minimum": 1, "maximum": 4,
                         "description": "How risky is it?"},
                "queue": {"enum": ["finance", "manager", None], "x-question": "Who reviews it?"},
            },
        },
    },
}


def reference_probs(engine, decision, temperature=1.0):
    """The same decision from one plain full forward of its prompt (no cache, no packing)."""
    logits = engine.backend.reference_logits(list(decision.tokens), list(decision.candidates))
    return restricted_softmax(logits, temperature)


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------- sequential


def test_sequential_prompts_grow_and_reuse_the_whole_previous_prompt(engine):
    engine.backend.cache.clear()
    d = engine.decide_schema(CONTEXT, SCHEMA, mode="sequential")
    fields = list(d.fields.values())
    assert [f.path for f in fields] == ["category", "refund", "review.risk", "review.queue"]
    for prev, cur in zip(fields, fields[1:], strict=False):
        # prompt k+1 is prompt k plus a tail, token for token and byte for byte ...
        assert cur.tokens[: len(prev.tokens)] == prev.tokens
        assert len(cur.tokens) > len(prev.tokens)
        tail = engine.backend.decode(cur.tokens[len(prev.tokens):])
        # ... the tail starts with the chosen VALUE written back, not its label ...
        assert tail.lstrip().startswith(record_text(prev.value, engine.specials))
        # ... and the cache served prompt k (reported by the backend, not assumed) but its
        # last token: a reading scores that token after the cached rest, in the model's steps
        assert cur.cached_tokens == prev.prompt_tokens - 1 == len(prev.tokens) - 1
    assert d.usage["input_tokens"] == sum(f.prompt_tokens for f in fields)
    assert d.usage["cached_tokens"] == sum(f.cached_tokens for f in fields)
    assert d.usage["output_tokens"] == len(fields)
    # the first prompt is exactly the System One position of the first field
    assert fields[0].tokens[: fields[0].cached_tokens] == tuple(
        engine.backend.encode(P.render_prefix(engine.format, CONTEXT, engine.context,
                                              engine.specials))[: fields[0].cached_tokens]
    )


def test_sequential_answers_equal_a_no_cache_run(engine):
    engine.backend.cache.clear()
    d = engine.decide_schema(CONTEXT, SCHEMA, mode="sequential", temperature=0.7)
    # the first field finds only the system prompt pinned at start-up; every later one finds
    # the previous prompt (more than the system prompt)
    assert [f.cached_tokens > engine.pinned_tokens for f in d.fields.values()] == [
        False, True, True, True]
    for f in d.fields.values():  # each prompt recomputed whole by a plain forward
        assert close(list(f.probabilities.values()), reference_probs(engine, f, 0.7))


class ProtocolOnly:
    """The engine's backend seen through the plain protocol: no steps, no ``generate``."""

    def __init__(self, backend):
        self._backend = backend

    def __getattr__(self, name):
        if name in ("step", "generate"):
            raise AttributeError(name)
        return getattr(self._backend, name)


def test_sequential_reuse_holds_on_a_protocol_only_backend(engine):
    from onepass.engine import DecisionEngine

    plain = DecisionEngine(ProtocolOnly(engine.backend), context=engine.context)
    assert not plain.capabilities.steps and not plain.capabilities.generates
    engine.backend.cache.clear()
    d = plain.decide_schema(CONTEXT, SCHEMA, mode="sequential")
    fast = engine.decide_schema(CONTEXT, SCHEMA, mode="sequential")
    fields = list(d.fields.values())
    for prev, cur in zip(fields, fields[1:], strict=False):
        assert cur.cached_tokens == prev.prompt_tokens
    for path, f in d.fields.items():
        assert f.tokens == fast.fields[path].tokens
        assert close(list(f.probabilities.values()),
                     list(fast.fields[path].probabilities.values()))
    with pytest.raises(ContractError) as err:
        plain.decide_schema(CONTEXT, {"properties": {"t": {"type": "string", "x-open": True}}})
    assert err.value.kind == "unsupported"


# --------------------------------------------------------------------------- batch


def test_batch_is_one_forward_and_each_field_equals_asking_it_alone(engine, monkeypatch):
    calls = []
    score = engine.backend.score

    def counting(prefix, suffixes, candidates):
        calls.append(len(suffixes))
        return score(prefix, suffixes, candidates)

    monkeypatch.setattr(engine.backend, "score", counting)
    monkeypatch.setattr(engine, "scorer", None)  # a server test may have shared steps
    d = engine.decide_schema(CONTEXT, SCHEMA, mode="batch")
    assert calls == [4]  # every field is one branch of one packed forward
    compiled = compile_schema(SCHEMA)
    for f in compiled.fields:
        alone_schema = {"properties": {"only": next(
            _node(SCHEMA, f.keys))}}
        alone = engine.decide_schema(CONTEXT, alone_schema, mode="batch").fields["only"]
        got = d.fields[f.path]
        assert close(list(got.probabilities.values()), list(alone.probabilities.values()))
        assert got.tokens == alone.tokens
        assert close(list(got.probabilities.values()), reference_probs(engine, got))


def _node(schema, keys):
    node = schema
    for key in keys:
        node = node["properties"][key]
    yield node


def test_temperature_acts_on_the_candidates_only(engine):
    cold = engine.decide_schema(CONTEXT, SCHEMA, mode="batch", temperature=1.0)
    hot = engine.decide_schema(CONTEXT, SCHEMA, mode="batch", temperature=3.0)
    for path, f in cold.fields.items():
        p1 = list(f.probabilities.values())
        powered = [p ** (1 / 3.0) for p in p1]
        expected = [p / sum(powered) for p in powered]
        assert close(list(hot.fields[path].probabilities.values()), expected, 1e-6)
        assert list(hot.fields[path].probabilities) == list(f.probabilities)
    assert hot.value == cold.value  # argmax is unchanged by temperature


def test_sampling_with_a_seed_is_reproducible_and_stays_in_the_domain(engine):
    compiled = compile_schema(SCHEMA)
    first, again = (
        engine.decide_schema(CONTEXT, SCHEMA, mode="sequential", temperature=50.0,
                             sample=True, seed=1)
        for _ in range(2)
    )
    assert first.value == again.value
    assert [f.label for f in first.fields.values()] == [f.label for f in again.fields.values()]
    runs = [
        engine.decide_schema(CONTEXT, SCHEMA, mode="batch", temperature=50.0, sample=True,
                             seed=seed)
        for seed in range(2, 6)
    ]
    assert all(compiled.validate(r.value) == [] for r in [first, *runs])
    # near-uniform candidates: four different seeds do not all draw the same object
    assert len({json.dumps(r.value) for r in runs}) > 1


# --------------------------------------------------------------------------- open branch


def _bias(engine, monkeypatch, toward_escape: bool):
    """Make the escape win (or lose) by shifting the model's real logit for it in every reading
    (the model's step scheduler: the one loop a library caller and the server share); returns
    the open values generated, as ``(token bound, ids)``."""
    score, continuation, calls = engine.generator.scheduler.score, engine.continuation, []
    shift = 100.0 if toward_escape else -100.0

    def biased_score(prefix, suffixes, candidates, **kw):
        result = score(prefix, suffixes, candidates, **kw)
        rows = [[*row[:-1], row[-1] + shift] for row in result.logits]
        return replace(result, logits=rows)

    def spied_continuation(prompt, max_tokens, **kw):
        ids, cached = continuation(prompt, max_tokens, **kw)
        calls.append((max_tokens, ids))
        return ids, cached

    monkeypatch.setattr(engine, "scorer", biased_score)
    monkeypatch.setattr(engine, "continuation", spied_continuation)
    return calls


OPEN = {
    "properties": {
        "vendor": {"enum": ["airline", "hotel"], "x-open": True, "maxLength": 30,
                   "description": "Who was paid?"},
        "paid": {"type": "boolean", "description": "Was it paid personally?"},
    }
}


@pytest.mark.parametrize("mode", ["sequential", "batch"])
def test_open_branch_writes_text_only_when_the_escape_wins(engine, monkeypatch, mode):
    calls = _bias(engine, monkeypatch, toward_escape=False)
    d = engine.decide_schema(CONTEXT, OPEN, mode=mode)
    vendor = d.fields["vendor"]
    assert not vendor.generated and vendor.value in ("airline", "hotel")
    assert vendor.probabilities[ESCAPE_KEY] < 1e-6
    assert calls == []  # nothing was generated

    monkeypatch.undo()
    calls = _bias(engine, monkeypatch, toward_escape=True)
    d = engine.decide_schema(CONTEXT, OPEN, mode=mode, max_open_tokens=12)
    vendor = d.fields["vendor"]
    assert vendor.generated and vendor.label == "C" and vendor.probabilities[ESCAPE_KEY] > 0.99
    generated = [ids for n, ids in calls if n > 0]
    assert len(generated) == 1 and 0 < len(generated[0]) <= 12
    text = engine.backend.decode(generated[0])
    # stopped at the first token that closed the string or passed a bound (12 tokens,
    # maxLength 30), or where the model ended its turn (its next greedy token is special)
    before = engine.backend.decode(generated[0][:-1])
    assert _string_end(before) is None and len(read_json_string(before)) <= 30
    prompt = [*vendor.tokens, *engine.backend.encode('"', bos=False), *generated[0]]
    assert (_string_end(text) is not None or len(generated[0]) == 12
            or len(read_json_string(text)) > 30 or engine.continuation(prompt, 1)[0] == [])
    assert isinstance(vendor.value, str) and len(vendor.value) <= 30
    assert compile_schema(OPEN).validate(d.value) == []
    assert d.learned == {"vendor": vendor.value}
    assert d.to_dict()["fields"]["vendor"]["generated"] is True
    assert d.usage["output_tokens"] == 2 + len(generated[0])
    if mode == "sequential":  # the generated value is written back for the next decision
        paid = d.fields["paid"]
        tail = engine.backend.decode(paid.tokens[len(vendor.tokens):])
        assert tail.lstrip().startswith(record_text(vendor.value, engine.specials))
        assert paid.cached_tokens >= vendor.prompt_tokens

    # passed back, the value is a declared option with its own label next time
    monkeypatch.undo()
    again = engine.decide_schema(CONTEXT, extend_schema(OPEN, d.learned), mode=mode)
    assert list(again.fields["vendor"].probabilities) == [
        "airline", "hotel", vendor.value, ESCAPE_KEY]


def test_open_branch_respects_the_token_bound_and_max_length(engine, monkeypatch):
    schema = {"properties": {"note": {"type": "string", "x-open": True, "maxLength": 4,
                                      "description": "Write a long note about the expense"}}}
    calls = _bias(engine, monkeypatch, toward_escape=True)
    d = engine.decide_schema(CONTEXT, schema, mode="sequential", max_open_tokens=3)
    note = d.fields["note"]
    assert note.generated and note.probabilities == {ESCAPE_KEY: 1.0}
    assert [len(ids) <= 3 for n, ids in calls if n > 0] == [True]
    assert isinstance(note.value, str) and len(note.value) <= 4
    assert compile_schema(schema).validate(d.value) == []


# --------------------------------------------------------------------------- contract


def test_limits_and_refusals_through_the_engine(engine, monkeypatch):
    with pytest.raises(ContractError) as err:
        engine.decide_schema(CONTEXT, {"properties": {"title": {"type": "string"}}})
    assert err.value.field == "schema.properties.title" and "'title'" in err.value.message
    monkeypatch.setattr(engine, "max_input_tokens", 40)
    for mode in ("sequential", "batch"):
        with pytest.raises(ContractError) as err:
            engine.decide_schema(CONTEXT, SCHEMA, mode=mode)
        assert err.value.field == "context" and err.value.kind == "max_tokens_exceeded"


def _count_work(engine, monkeypatch) -> dict:
    """Characters tokenized; any model call (forward, prefill or generation) fails the test."""
    seen = {"chars": 0}
    encode = engine.backend.encode

    def counting(text, *args, **kwargs):
        seen["chars"] += len(text)
        return encode(text, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran for a request over the token limit")

    monkeypatch.setattr(engine.backend, "encode", counting)
    for name in ("score", "prefill", "step"):
        monkeypatch.setattr(engine.backend, name, forbidden)
    return seen


@pytest.mark.parametrize(("mode", "where"), [("batch", "context"), ("sequential", "context"),
                                             ("sequential", "last question")])
def test_an_over_limit_run_is_refused_before_any_forward(engine, monkeypatch, mode, where):
    """Before: the batch run tokenized the whole prompt once per field, and the sequential
    one decided eight fields (eight forwards) before it met a question too long to ask."""
    big = "word " * 40_000
    fields = {f"f{i}": {"type": "boolean", "description": f"Is claim {i} true?"}
              for i in range(8)}
    if where == "last question":
        fields["last"] = {"enum": [f"v{i}" for i in range(20)], "description": big}
    seen = _count_work(engine, monkeypatch)
    with pytest.raises(ContractError) as err:
        engine.decide_schema(big if where == "context" else CONTEXT, {"properties": fields},
                             mode=mode)
    assert (err.value.kind, err.value.field) == ("max_tokens_exceeded", "context")
    assert seen["chars"] < 3 * len(big) + 10_000


class FakeClock:
    """``time`` for the schema runner: monotonic() is what the test says it is."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick = 0.0, tick
        self.perf_counter = time.perf_counter

    def monotonic(self) -> float:
        self.now += self.tick
        return self.now


def test_a_run_past_its_time_limit_stops_between_fields(engine, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(runner, "time", clock)
    score, calls = engine.generator.scheduler.score, []

    def slow(prefix, suffixes, candidates, **kw):  # every reading "takes" 6 s
        calls.append(len(suffixes))
        clock.now += 6.0
        return score(prefix, suffixes, candidates, **kw)

    monkeypatch.setattr(engine, "scorer", slow)
    with pytest.raises(ContractError) as err:
        engine.decide_schema(CONTEXT, SCHEMA, mode="sequential", time_limit=10.0)
    assert (err.value.kind, err.value.field) == ("request_too_large", "schema")
    assert "time limit of 10 s per request after 2 of 4 fields" in err.value.message
    assert calls == [1, 1]  # the third field never reached the model
    assert engine.decide_schema(CONTEXT, SCHEMA, mode="batch", time_limit=10.0).value


def test_a_run_past_its_time_limit_stops_generating(engine, monkeypatch):
    schema = {"properties": {"note": {"type": "string", "x-open": True,
                                      "description": "Write a long note about the expense"}}}
    calls = _bias(engine, monkeypatch, toward_escape=True)
    engine.decide_schema(CONTEXT, schema, mode="sequential", max_open_tokens=24)
    free = [len(ids) for n, ids in calls if n > 0]
    assert free[0] > 6  # unbounded in time, the note runs longer than six tokens
    calls.clear()
    monkeypatch.setattr(runner, "time", FakeClock(tick=1.0))  # 1 s per clock read
    with pytest.raises(ContractError) as err:
        engine.decide_schema(CONTEXT, schema, mode="sequential", max_open_tokens=24,
                             time_limit=5.0)
    assert err.value.kind == "request_too_large" and "0 of 1 fields" in err.value.message
    (cut,) = [len(ids) for n, ids in calls if n > 0]
    assert cut <= 5 < free[0]  # the clock, read after every token, passed 5 s: cut short


def decide_request(engine, body):
    """What POST /v1/decisions/schema does with a decoded body."""
    return run_plan(engine, parse_decisions(engine, body)).to_dict()


def test_decide_request_answers_the_documented_shape(engine):
    body = {"model": "jev-latest", "context": {"receipt": CONTEXT}, "schema": SCHEMA,
            "mode": "batch", "temperature": 0.5, "sample": True, "seed": 4}
    response = decide_request(engine, body)
    assert set(response) == {"model", "mode", "value", "fields", "usage"}
    assert response["model"] == engine.served_name and response["mode"] == "batch"
    assert list(response["fields"]) == ["category", "refund", "review.risk", "review.queue"]
    for entry in response["fields"].values():
        assert set(entry) == {"value", "probabilities", "cached_tokens"}
        assert all(isinstance(k, str) for k in entry["probabilities"])
        assert abs(sum(entry["probabilities"].values()) - 1) < 1e-9
    assert response["fields"]["review.queue"]["probabilities"].keys() == {
        "finance", "manager", "null"}
    assert all(isinstance(v, int) for v in response["usage"].values())
    assert compile_schema(SCHEMA).validate(response["value"]) == []
    again = decide_request(engine, body)  # seeded draws repeat; the context is now cached
    assert again["value"] == response["value"]
    assert again["usage"]["cached_tokens"] > response["usage"]["cached_tokens"]
    json.dumps(response)
    with pytest.raises(ContractError) as err:
        decide_request(engine, {**body, "model": "gpt-4"})
    assert err.value.kind == "model_not_found"


def test_cli_prints_the_same_json(engine, monkeypatch, tmp_path, capsys):
    from onepass import cli
    from onepass.commands import decide_schema as command

    monkeypatch.setattr(command, "engine_from_args", lambda args: engine)
    (tmp_path / "ctx.txt").write_text(CONTEXT)
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    args = ["decide-schema", "--context", str(tmp_path / "ctx.txt"),
            "--schema", str(tmp_path / "schema.json"), "--mode", "batch"]
    assert cli.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    direct = decide_request(engine, {"context": CONTEXT, "schema": SCHEMA, "mode": "batch"})
    assert printed["value"] == direct["value"] and printed["mode"] == "batch"
    for path, entry in printed["fields"].items():
        assert close(list(entry["probabilities"].values()),
                     list(direct["fields"][path]["probabilities"].values()))
    (tmp_path / "bad.json").write_text(json.dumps({"properties": {"t": {"type": "string"}}}))
    assert cli.main([*args[:3], "--schema", str(tmp_path / "bad.json")]) == 2
    assert "schema.properties.t" in capsys.readouterr().err
