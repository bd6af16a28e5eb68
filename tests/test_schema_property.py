"""Property: over random schemas, modes and readout options, every returned value is in its
field's declared domain, on the real embedded model (few, small examples: it runs the model)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onepass.schema import ESCAPE_KEY, _value_id, compile_schema, value_text

WORDS = ["red", "green", "blue", "small", "large", "late", "n/a", "high five", "42", "ok"]
CONTEXTS = [
    "The parcel arrived two days late and the box was damaged.",
    {"ticket": 812, "text": "Printer on floor 3 is out of toner again.", "vip": False},
    "Invoice 77: 3 chairs, 1 desk. Paid.",
]

scalars = st.one_of(
    st.sampled_from(WORDS), st.integers(-3, 20), st.sampled_from([0.5, 2.25]), st.none()
)
enum_field = st.builds(
    lambda values, open_: {"enum": values, "description": "Which one applies?",
                           **({"x-open": True, "maxLength": 10} if open_ else {})},
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True),
    st.booleans(),
)
mixed_enum = st.builds(
    lambda values: {"enum": values},
    st.lists(scalars, min_size=2, max_size=4, unique_by=value_text),
)
boolean = st.just({"type": "boolean", "description": "Is it urgent?"})
number_range = st.builds(
    lambda lo, n, step: {"type": "number", "minimum": lo, "maximum": lo + n * step,
                         "x-step": step, "description": "How much?"},
    st.sampled_from([0, 0.5, -1]), st.integers(1, 10), st.sampled_from([0.1, 0.25, 1, 2]),
)
integer_range = st.builds(
    lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
    st.integers(-2, 3), st.integers(1, 6),
)
score_list = st.builds(
    lambda levels: {"x-score": levels, "description": "How severe?"},
    st.lists(st.sampled_from(WORDS), min_size=2, max_size=5, unique=True),
)
const = st.builds(lambda v: {"const": v}, scalars)
open_string = st.just({"type": "string", "x-open": True, "maxLength": 8,
                       "description": "One word for it"})
leaf = st.one_of(enum_field, mixed_enum, boolean, number_range, integer_range, score_list,
                 const, open_string)


def _object(children):
    return {"type": "object", "properties": {f"f{i}": c for i, c in enumerate(children)}}


schemas = st.lists(
    st.one_of(leaf, st.lists(leaf, min_size=1, max_size=2).map(_object)),
    min_size=1, max_size=3,
).map(_object)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two cores shared with other jobs: more than one intra-op thread thrashes."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(
    schema=schemas,
    context=st.sampled_from(CONTEXTS),
    mode=st.sampled_from(["sequential", "batch"]),
    temperature=st.sampled_from([0.5, 1.0, 4.0]),
    sample=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_every_value_is_a_declared_value(engine, schema, context, mode, temperature, sample,
                                         seed):
    compiled = compile_schema(schema)
    d = engine.decide_schema(context, schema, mode=mode, temperature=temperature,
                             sample=sample, seed=seed, max_open_tokens=4)
    assert compiled.validate(d.value) == []
    assert list(d.value) == list(schema["properties"])  # declared order is kept
    assert list(d.fields) == [f.path for f in compiled.fields]
    for f in compiled.fields:
        got = d.fields[f.path]
        assert f.contains(got.value)
        assert abs(sum(got.probabilities.values()) - 1.0) < 1e-9
        if f.trivial:
            assert got.value == f.values[0] and got.label is None
            continue
        assert tuple(got.probabilities) == f.keys_text
        if got.generated:  # free text only through the declared escape
            assert f.open and isinstance(got.value, str)
            assert got.probabilities[ESCAPE_KEY] > 0
        else:
            assert _value_id(got.value) in {_value_id(v) for v in f.values}
        if not sample:  # argmax over the candidates, declared order breaking ties
            probs = list(got.probabilities.values())
            chosen = ESCAPE_KEY if got.generated else value_text(got.value)
            assert got.probabilities[chosen] == max(probs)
