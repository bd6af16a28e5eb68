"""Generation on the llamacpp backend runs in the model's one step scheduler (our sampler, our
grammars, the shared prefix cache), and it produces what a naive decode produces.

The engine runs in a child process (tests/native_worker.py), so a native crash fails one test;
the HTTP half starts a real ``onepass serve --backend llamacpp`` and drives it with the
official OpenAI SDK, as a user would. Skipped (saying why) without llama-cpp-python.
"""

from __future__ import annotations

import json

import httpx
import pytest
from native_worker import NativeWorker, require_llamacpp

openai = pytest.importorskip("openai")

HELPERS = """
from onepass.generate.runner import collect
from onepass.generate.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, logprobs=0)


def chat_ids(text):
    return engine.generator.chat_prompt([{"role": "user", "content": text}])


def greedy(text, n):
    (g,) = engine.generator.run(chat_ids(text), GREEDY, n)
    return [t.id for t in g.tokens], g.cached_tokens, g.finish_reason


def greedy_by_recomputation(text, n):
    # the naive reference: the whole sequence decoded from an empty cache for every token
    ids, out, vocab = chat_ids(text), [], range(backend.vocab_size)
    for _ in range(n):
        logits = backend.reference_logits(ids, vocab)
        token = max(vocab, key=logits.__getitem__)
        if token in backend.eos_ids:
            break
        out.append(token)
        ids.append(token)
    return out


def together(texts, n):
    streams = [engine.generator.start(chat_ids(t), GREEDY, n)[0] for t in texts]
    return [[t.id for t in collect(s).tokens] for s in streams]


def sampled(text, seed, n, count=1):
    params = SamplingParams(temperature=1.0, seed=seed)
    return [g.text for g in engine.generator.run(chat_ids(text), params, n, n=count)]


REFUND = {"state": "The order arrived broken.",
          "questions": {"refund": {"type": "noul", "instructions": "Should we refund?"}}}


def decide_between_steps(text):
    # a decision while a stream is half-way runs between two of its steps: it answers as it
    # does alone, and the stream goes on as if it had not been there
    alone = engine.answer(REFUND)["answers"]["refund"]["noul"]
    reference = greedy(text, 24)[0]
    stream = engine.generator.start(chat_ids(text), GREEDY, 24)[0]
    events = iter(stream)
    first = next(events)
    middle = engine.answer(REFUND)["answers"]["refund"]["noul"]
    rest = collect(stream)
    return alone, middle, [t.id for t in first.tokens] + [t.id for t in rest.tokens] == reference
"""

SETUP = """
from onepass.backends.llamacpp import LlamaCppBackend, gguf_path
from onepass.engine import DecisionEngine

path, name = gguf_path(None)
backend = LlamaCppBackend(path, name=name, n_ctx=2048, n_threads=1)
engine = DecisionEngine(backend)
""" + HELPERS


@pytest.fixture(scope="module")
def worker():
    require_llamacpp("llama-cpp-python", "llama_cpp")
    with NativeWorker(SETUP, what="the llama.cpp worker process") as native:
        yield native


RIVERS = "Write a long essay about rivers."


def test_greedy_in_the_scheduler_equals_full_recomputation(worker):
    reference = worker.call("greedy_by_recomputation", RIVERS, 32)
    assert len(reference) == 32  # the reference itself did not stop early
    ids, cached, finish = worker.call("greedy", RIVERS, 32)
    assert ids == reference
    assert finish == "length"


def test_batched_sequences_and_a_cache_hit_equal_the_sequence_alone(worker):
    prompts = [RIVERS, "Name three colors and a fruit.", "What is 2+2? Explain.",
               "Tell me a short story about a cat."]
    alone = [worker.call("greedy", p, 16)[0] for p in prompts]
    assert worker.call("together", prompts, 16) == alone
    ids, cached, _ = worker.call("greedy", RIVERS, 16)  # the prompt is in the prefix cache now
    assert cached > 0 and ids == alone[0]


def test_seeded_sampling_repeats_and_n_choices_differ(worker):
    a = worker.call("sampled", "Invent a name for a new planet.", 7, 16)
    assert worker.call("sampled", "Invent a name for a new planet.", 7, 16) == a
    pair = worker.call("sampled", "Invent a name for a new planet.", 11, 16, 2)
    assert pair[0] != pair[1]


def test_a_decision_runs_between_steps_of_a_stream(worker):
    alone, middle, stream_unchanged = worker.call("decide_between_steps", RIVERS)
    assert 0.0 < alone < 1.0 and abs(middle - alone) < 1e-6
    assert stream_unchanged


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_llamacpp("llama-cpp-python", "llama_cpp")
    from server_process import serve

    log = tmp_path_factory.mktemp("llamacpp-serve") / "server.log"
    with serve(["--backend", "llamacpp", "--threads", "1"], log) as url:
        yield url


QUESTION = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"}]


def test_chat_sync_equals_stream_with_usage(client, model):
    sync = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16,
                                          temperature=0)
    text = sync.choices[0].message.content
    assert "Paris" in text
    chunks = list(client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage.completion_tokens == sync.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same prompt, from the cache


def test_completions_and_responses(client, model):
    out = client.completions.create(model=model, prompt="The capital of France is",
                                    max_tokens=6, temperature=0, logprobs=2)
    choice = out.choices[0]
    assert choice.text and len(choice.logprobs.tokens) == out.usage.completion_tokens
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    reply = client.responses.create(model=model, input="Say hello.", max_output_tokens=8,
                                    temperature=0)
    assert reply.status in ("completed", "incomplete") and reply.output_text


def test_structured_output_validates(client, model):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=64, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": schema, "strict": True}})
    assert out.choices[0].finish_reason == "stop"
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"city", "is_capital"} and isinstance(value["is_capital"], bool)
    assert len(value["city"]) <= 20


def test_echo_with_logprobs_is_a_400_naming_echo(server, model):
    body = {"model": model, "prompt": "Hello there", "max_tokens": 0, "echo": True,
            "logprobs": 1}
    r = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "echo" in r.text and "--backend torch" in r.text
    # and the server still answers
    assert httpx.get(server + "/health", timeout=10).status_code == 200
