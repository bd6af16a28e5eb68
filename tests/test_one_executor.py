"""A decision's open value is generated inside the model's step scheduler when steps are shared
(the server), not in a loop of its own that holds the model: the same value as the backend's
greedy loop, and a stream running beside it keeps getting tokens meanwhile (before, the open
value held the backend lock for its whole loop and every stream stalled)."""

from __future__ import annotations

import threading
import time

import pytest

from onepass.generate.sampling import SamplingParams

CONTEXT = "Taxi from the airport to the hotel, 42 EUR, paid personally; the receipt is missing."
NOTE = {"properties": {
    "note": {"type": "string", "x-open": True, "maxLength": 400,
             "description": "Describe the expense for the accountant in two sentences"},
    "amount": {"type": "integer", "x-open": True, "minimum": 0, "maximum": 100000,
               "enum": [0], "description": "How much was paid, in EUR?"},
}}


@pytest.fixture
def shared_steps(engine):
    """The session engine with its scoring routed through its scheduler, as the server does;
    restored afterwards (other tests call the backend directly)."""
    saved = engine.scorer
    engine.share_steps()
    try:
        yield engine
    finally:
        engine.scorer = saved


def decide(engine, **options):
    return engine.decide_schema(CONTEXT, NOTE, mode="sequential", max_open_tokens=40,
                                **options)


def test_open_values_in_shared_steps_equal_the_backend_loop(engine, shared_steps):
    saved, engine.scorer = engine.scorer, None
    try:
        alone = decide(engine)
    finally:
        engine.scorer = saved
    shared = decide(shared_steps)
    assert shared.fields["note"].generated and len(shared.fields["note"].value) > 10
    assert shared.value == alone.value
    # each sequential prompt reads the previous one from the cache: all of it through the
    # backend's loop, all but its last token through the shared steps (a decision stores its
    # prefix; the position it reads is a suffix)
    fields = list(shared.fields.values())
    for prev, cur in zip(fields, fields[1:]):
        assert cur.tokens[: len(prev.tokens)] == prev.tokens
        assert cur.cached_tokens >= len(prev.tokens) - 1
    for name in ("note", "amount"):
        assert shared.fields[name].probabilities == pytest.approx(
            alone.fields[name].probabilities, abs=1e-4)


def test_a_stream_keeps_running_while_an_open_value_is_generated(shared_steps):
    engine = shared_steps
    scheduler = engine.generator.scheduler
    prompt = engine.generator.chat_prompt([{"role": "user", "content": "Count to a thousand."}])
    stream = scheduler.submit(prompt, SamplingParams(temperature=0.0, ignore_eos=True), 400)
    arrivals: list[float] = []

    def read() -> None:
        for _event in stream:
            arrivals.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        while not arrivals:  # the stream is decoding
            time.sleep(0.01)
        started = time.monotonic()
        decision = decide(engine)
        ended = time.monotonic()
    finally:
        stream.cancel()
        reader.join(timeout=60)
    generated = decision.usage["output_tokens"]
    during = sum(started <= t <= ended for t in arrivals)
    print(f"\n{generated} decision tokens; the stream got {during} tokens meanwhile")
    assert generated > 10
    # one stream token per shared step: about one per generated decision token (a few steps
    # carry only the decision's prompt chunks)
    assert during >= generated // 2
