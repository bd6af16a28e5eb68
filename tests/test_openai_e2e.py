"""OpenAI-compatible generation against a real `onepass serve` process, driven by the official
`openai` SDK (sync, async, streaming) and by raw HTTP for the error table."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

QUESTION = [{"role": "user", "content": "Name three colors."}]


def test_models_list_names_the_served_model(client, model, engine):
    ids = [m.id for m in client.models.list().data]
    assert model == engine.served_name and "jev-latest" in ids


# --------------------------------------------------------------------------- chat


def test_chat_greedy_sync_equals_streaming(client, model):
    sync = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12,
                                          temperature=0)
    assert sync.object == "chat.completion" and sync.id.startswith("chatcmpl-")
    assert sync.choices[0].message.role == "assistant"
    text = sync.choices[0].message.content
    assert text and sync.choices[0].finish_reason in ("stop", "length")
    usage = sync.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens

    chunks = list(client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == sync.choices[0].finish_reason and not any(finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        usage.completion_tokens)
    assert len({c.id for c in chunks}) == 1
    # the second identical prompt starts from the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_chat_length_finish_and_n_choices(client, model):
    out = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=3,
                                         temperature=0, n=2, logprobs=True, top_logprobs=2)
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        assert choice.finish_reason == "length"
        assert len(choice.logprobs.content) == 3
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert out.choices[0].message.content == out.choices[1].message.content  # greedy
    single = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=3,
                                            temperature=0)
    assert out.usage.prompt_tokens == single.usage.prompt_tokens  # counted once
    assert out.usage.completion_tokens == 6


def test_seeded_sampling_repeats(client, model):
    def sample() -> list[str]:
        out = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8,
                                             temperature=1.0, seed=1234, n=2)
        return [c.message.content for c in out.choices]

    first = sample()
    assert sample() == first


def test_stop_string_is_never_emitted(client, model):
    base = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16,
                                          temperature=0).choices[0].message.content
    words = base.split()
    assert len(words) >= 2, base
    stop = words[1]
    cut = base[: base.index(stop)]
    out = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16,
                                         temperature=0, stop=[stop])
    assert out.choices[0].message.content == cut
    assert stop not in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=16, temperature=0, stop=stop,
            stream=True) if c.choices)
    assert streamed == cut


def test_async_client_chat(server, model):
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="local", timeout=120,
                                    max_retries=0)
        try:
            calls = [client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=6, temperature=0) for i in (2, 3)]
            results = await asyncio.gather(*calls)
            stream = await client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=6, temperature=0, stream=True)
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return [r.choices[0].message.content for r in results] + ["".join(parts)]
        finally:
            await client.close()

    texts = asyncio.run(run())
    assert all(texts) and len(texts) == 3


# --------------------------------------------------------------------------- completions


def test_completions_string_and_token_prompts(client, model, engine):
    text = "The capital of France is"
    ids = engine.backend.encode(text)
    by_text = client.completions.create(model=model, prompt=text, max_tokens=5,
                                        temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.object == "text_completion" and by_text.id.startswith("cmpl-")
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.choices[0].finish_reason == "length"
    assert by_ids.usage.prompt_tokens == len(ids) and by_ids.usage.completion_tokens == 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=text, max_tokens=5, temperature=0, stream=True) if c.choices)
    assert streamed == by_text.choices[0].text


def test_completions_scoring_returns_prompt_logprobs(client, model, engine):
    text = "The quick brown fox jumps over the lazy dog"
    ids = engine.backend.encode(text)
    out = client.completions.create(model=model, prompt=text, max_tokens=0, echo=True,
                                    logprobs=2)
    choice = out.choices[0]
    assert choice.text == text and out.usage.completion_tokens == 0
    expected = engine.backend.prompt_logprobs(ids, 2)
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(ids)
    assert lp.token_logprobs[1:] == pytest.approx([e[0] for e in expected], abs=1e-4)
    best = [engine.backend.decode([e[1][0][0]]) for e in expected]
    assert [max(t, key=t.get) for t in lp.top_logprobs[1:]] == best
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_completions_echo_with_generation(client, model):
    out = client.completions.create(model=model, prompt="One, two,", max_tokens=4,
                                    temperature=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text.startswith("One, two,")
    assert len(choice.logprobs.tokens) == out.usage.prompt_tokens + 4
    assert choice.logprobs.token_logprobs[0] is None


# --------------------------------------------------------------------------- responses


def test_responses_sync_stream_store_and_follow_up(client, model):
    first = client.responses.create(model=model, input="Say hello.", instructions="Be brief.",
                                    max_output_tokens=8, temperature=0, store=True)
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.output_text and first.status in ("completed", "incomplete")
    if first.status == "incomplete":
        assert first.incomplete_details.reason == "max_output_tokens"
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert first.max_output_tokens == 8

    again = client.responses.retrieve(first.id)
    assert again.output_text == first.output_text and again.store
    items = client.responses.input_items.list(first.id)
    assert [i.role for i in items.data] == ["user"]
    assert items.data[0].content[0].text == "Say hello."

    with client.responses.create(model=model, input="And goodbye?", max_output_tokens=6,
                                 temperature=0, previous_response_id=first.id,
                                 stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas and final.previous_response_id == first.id
    # the follow-up carries the stored conversation: a longer prompt than the turn alone
    alone = client.responses.create(model=model, input="And goodbye?", max_output_tokens=1)
    assert final.usage.input_tokens > alone.usage.input_tokens

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=model, input="x", previous_response_id=first.id)
    assert err.value.param == "previous_response_id"


def test_responses_incomplete_at_max_output_tokens(client, model):
    out = client.responses.create(model=model, input="Write a long story about a cat.",
                                  max_output_tokens=2, temperature=0)
    assert out.status == "incomplete"
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 2 and not out.store


# --------------------------------------------------------------------------- errors


BAD = [
    ("/v1/chat/completions", {"messages": QUESTION, "temperature": 5}, "temperature"),
    ("/v1/chat/completions", {"messages": QUESTION, "top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"messages": QUESTION, "n": 9}, "n"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 10**6}, "max_tokens"),
    ("/v1/chat/completions", {"messages": QUESTION, "logit_bias": {"999999": 1}},
     "logit_bias"),
    ("/v1/chat/completions", {"messages": QUESTION, "stop": ["a"] * 5}, "stop"),
    ("/v1/chat/completions", {"messages": QUESTION, "tools": [{"type": "function"}]},
     "tools[0].function"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": QUESTION, "colour": 1}, "colour"),
    ("/v1/completions", {"prompt": [10**7]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 9}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/responses", {"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ("/v1/responses", {"input": [{"type": "function_call"}]}, "input[0].call_id"),
    ("/v1/responses", {"input": [{"type": "computer_call"}]}, "input[0].type"),
]


def test_bad_parameters_get_400_naming_them_and_the_server_still_answers(server, model):
    with httpx.Client(base_url=server, timeout=60) as http:
        for path, body, param in BAD:
            r = http.post(path, json={"model": model, **body})
            assert r.status_code == 400, (path, body, r.text)
            error = r.json()["error"]
            assert error["param"] == param, (body, error)
            assert error["message"].startswith(f"{param}: "), error
        r = http.post("/v1/chat/completions", content=b"{not json",
                      headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_json"
        r = http.post("/v1/chat/completions", json={"model": model, "messages": QUESTION,
                                                    "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_unknown_model_is_404_before_any_work(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-nope", messages=QUESTION, max_tokens=2)
    assert err.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-nope", input="x")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-nope", prompt="x", max_tokens=1)


def _active_sequences(server: str) -> float:
    for line in httpx.get(server + "/metrics", timeout=10).text.splitlines():
        if line.startswith("onepass_generation_active_sequences "):
            return float(line.split()[1])
    raise AssertionError("no onepass_generation_active_sequences in /metrics")


def test_disconnect_mid_stream_frees_the_slot(server, client, model):
    body = {"model": model, "messages": QUESTION, "max_tokens": 1500, "temperature": 1.0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server, timeout=60) as http, http.stream(
        "POST", "/v1/chat/completions", json=body
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line and '"role"' not in line:
                # a generated token arrived: the sequence is running (leaving this loop
                # closes the connection mid-stream: that is the disconnect)
                assert _active_sequences(server) == 1
                break
        else:
            raise AssertionError("the stream ended before a generated token")
    deadline = time.monotonic() + 20  # 1500 tokens would take minutes: it was cancelled
    while _active_sequences(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _active_sequences(server) == 0
    out = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)
    assert out.choices[0].finish_reason == "length"


def test_generation_metrics_count_tokens_and_latency(server, client, model):
    def scrape() -> dict[str, float]:
        out = {}
        for line in httpx.get(server + "/metrics", timeout=10).text.splitlines():
            if line.startswith("onepass_generation_") and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    before = scrape()
    out = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4,
                                         temperature=0)
    after = scrape()

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("onepass_generation_prompt_tokens_total") == out.usage.prompt_tokens
    assert grew("onepass_generation_completion_tokens_total") == out.usage.completion_tokens
    reason = out.choices[0].finish_reason
    assert grew(f'onepass_generation_sequences_total{{reason="{reason}"}}') == 1
    assert grew("onepass_generation_time_to_first_token_seconds_count") == 1
    assert grew("onepass_generation_batch_size_count") >= out.usage.completion_tokens
    assert after["onepass_generation_active_sequences"] == 0


# --------------------------------------------------------------------------- in-process


def test_a_failure_after_the_stream_started_is_an_error_frame(engine, monkeypatch):
    """The 200 status line is gone once a stream starts: a failing sequence ends the stream
    with an error frame (then [DONE] on chat), never as if the text were complete."""
    from fastapi.testclient import TestClient

    from onepass.generate.scheduler import Delta, Finish, GenerationStream
    from onepass.server.app import create_app

    def failing(prompt, params, max_tokens, n=1, grammar=None, deadline=None):
        streams = []
        for _ in range(n):
            stream = GenerationStream()
            stream.push(Delta("Hel"))
            stream.push(Finish("error", len(prompt), 1, 0, RuntimeError("device lost")))
            streams.append(stream)
        return streams

    monkeypatch.setattr(engine.generator, "start", failing)
    with TestClient(create_app(engine)) as http:
        r = http.post("/v1/chat/completions", json={"messages": QUESTION, "stream": True})
        assert r.status_code == 200
        frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert '"content":"Hel"' in frames[1]
        assert frames[-2].startswith('{"error":') and "internal_error" in frames[-2]
        assert frames[-1] == "[DONE]" and "finish_reason\":\"" not in "".join(frames)

        r = http.post("/v1/responses", json={"input": "x", "stream": True})
        kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
        assert kinds[-2:] == ["error", "response.failed"]
        assert "response.completed" not in kinds

        r = http.post("/v1/chat/completions", json={"messages": QUESTION})
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
