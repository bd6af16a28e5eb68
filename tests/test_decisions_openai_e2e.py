"""POST /v1/decisions against a real `onepass serve` (the shared ``server`` fixture), driven by
the official `openai` SDK's ``client.decisions.create``: sync, async, raw response, the same
numbers as System One, typed choice values, errors as the SDK's typed exceptions, the prompt
cache partition, and the JSON-Schema decisions at their new and deprecated paths."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

STATE = "The parcel arrived broken and nobody answers my emails. I want my money back."
QUESTIONS = [
    {"type": "predicate", "name": "complaint", "instructions": "The customer is complaining."},
    {"type": "choice", "name": "wants", "instructions": "What does the customer want?",
     "choices": [{"value": True, "description": "a refund"}, {"value": "true"},
                 {"value": "replacement", "description": "a new parcel"}]},
    {"type": "score", "instructions": "How angry is the customer?",
     "levels": [{"label": "calm"}, {"label": "annoyed", "description": "a bit"},
                {"label": "furious"}]},
]
# the same questions in System One's shape (option names as decisions_openai derives them)
SYSTEM_ONE = {"state": STATE, "questions": {
    "complaint": {"type": "noul", "instructions": "The customer is complaining."},
    "wants": {"type": "choice", "instructions": "What does the customer want?",
              "criteria": {"true": "a refund", '"true"': None, "replacement": "a new parcel"}},
    "anger": {"type": "score", "instructions": "How angry is the customer?",
              "criteria": ["calm", "annoyed: a bit", "furious"]},
}}
SCHEMA_BODY = {"context": "Team lunch with a client: 42 EUR.", "mode": "batch", "schema": {
    "type": "object", "properties": {"refundable": {"type": "boolean"}}}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="local", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def system_one(server):
    r = httpx.post(server + "/v1/systemone", json=SYSTEM_ONE, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def check_against_system_one(decision, reference) -> None:
    a = decision.answers
    assert [x.type for x in a] == ["predicate", "choice", "score"]
    assert [x.name for x in a] == ["complaint", "wants", None]
    ref = reference["answers"]
    assert a[0].probability == pytest.approx(ref["complaint"]["noul"], abs=1e-6)
    probs = ref["wants"]["probabilities"]
    assert [(type(p.value), p.value) for p in a[1].probabilities] == [
        (bool, True), (str, "true"), (str, "replacement")]
    assert [p.probability for p in a[1].probabilities] == pytest.approx(
        [probs["true"], probs['"true"'], probs["replacement"]], abs=1e-6)
    want = {"true": True, '"true"': "true", "replacement": "replacement"}[ref["wants"]["choice"]]
    assert a[1].choice == want and type(a[1].choice) is type(want)
    assert a[1].confidence == pytest.approx(ref["wants"]["confidence"], abs=1e-6)
    assert a[2].score == pytest.approx(ref["anger"]["score"], abs=1e-6)  # 0-based, as System One
    assert [(p.label, p.value) for p in a[2].probabilities] == [
        ("calm", 0), ("annoyed", 1), ("furious", 2)]
    assert [p.probability for p in a[2].probabilities] == pytest.approx(
        [ref["anger"]["probabilities"][str(i)] for i in range(3)], abs=1e-6)
    assert a[2].confidence == pytest.approx(ref["anger"]["confidence"], abs=1e-6)
    u = decision.usage
    assert u.input_tokens == reference["usage"]["input_tokens"]
    assert u.output_tokens == 3 and u.total_tokens == u.input_tokens + 3
    assert u.output_tokens_details.reasoning_tokens == 0


def test_sync_create_equals_system_one(client, system_one, engine):
    decision = client.decisions.create(model="jev-latest", input=STATE, questions=QUESTIONS)
    assert decision.model == engine.served_name
    check_against_system_one(decision, system_one)


def test_a_lone_user_message_reads_the_same_prompt(client, system_one):
    decision = client.decisions.create(
        model="jev-latest", questions=QUESTIONS,
        input=[{"role": "user", "content": [{"type": "input_text", "text": STATE}]}])
    check_against_system_one(decision, system_one)


def test_async_create(server, system_one):
    async def run():
        async with openai.AsyncOpenAI(base_url=server + "/v1", api_key="local", timeout=120,
                                      max_retries=0) as client:
            return await asyncio.gather(*(
                client.decisions.create(model="jev-latest", input=STATE, questions=QUESTIONS)
                for _ in range(3)))

    for decision in asyncio.run(run()):
        check_against_system_one(decision, system_one)


def test_raw_response_has_the_request_id(client, system_one):
    raw = client.decisions.with_raw_response.create(model="jev-latest", input=STATE,
                                                    questions=QUESTIONS)
    assert raw.status_code == 200
    assert raw.headers["x-typesafe-request-id"].startswith("req_")
    assert "deprecation" not in raw.headers
    check_against_system_one(raw.parse(), system_one)


def test_a_conversation_with_tool_calls_is_answered(client):
    decision = client.decisions.create(model="jev-latest", questions=QUESTIONS[:1], input=[
        {"role": "developer", "content": "Support inbox."},
        {"role": "user", "content": "Where is my parcel?"},
        {"type": "function_call", "call_id": "c1", "name": "track", "arguments": '{"id": 7}'},
        {"type": "function_call_output", "call_id": "c1", "output": "delivered, damaged"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It arrived."}]},
    ])
    assert decision.answers[0].type == "predicate"
    assert 0.0 < decision.answers[0].probability < 1.0


def test_errors_are_the_sdks_typed_exceptions(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.decisions.create(model="jev-latest", input=STATE, questions=[
            {"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}])
    assert "questions[0].choices[1].value" in info.value.message
    assert info.value.body["param"] == "questions[0].choices[1].value"
    with pytest.raises(openai.BadRequestError, match="text-only"):
        client.decisions.create(model="jev-latest", questions=QUESTIONS[:1], input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y"}]}])
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.call_id"):
        client.decisions.create(model="jev-latest", questions=QUESTIONS[:1], input=[
            {"type": "function_call_output", "call_id": "nope", "output": "x"}])
    with pytest.raises(openai.NotFoundError, match="gpt-6-luna"):
        client.decisions.create(model="gpt-6-luna", input=STATE, questions=QUESTIONS[:1])
    with pytest.raises(openai.BadRequestError, match="questions"):
        client.decisions.create(model="jev-latest", input=STATE, questions=[])
    # the server still answers
    assert client.decisions.create(model="jev-latest", input=STATE,
                                   questions=QUESTIONS[:1]).answers[0].type == "predicate"


def test_prompt_too_long_names_the_input(client):
    with pytest.raises(openai.APIStatusError) as info:
        client.decisions.create(model="jev-latest", input="word " * 20000,
                                questions=QUESTIONS[:1])
    assert info.value.status_code == 413 and "input" in info.value.message


def test_wrong_api_key_is_an_authentication_error(engine, monkeypatch):
    httpx2 = pytest.importorskip("httpx2")
    from onepass.server import ServerSettings, create_app

    # the app shares the session engine's steps; the tests after this one that read the
    # packed forward get the engine back as it was
    monkeypatch.setattr(engine, "scorer", engine.scorer)
    app = create_app(engine, ServerSettings(api_key="right"))

    async def run(key):
        async with openai.AsyncOpenAI(
                base_url="http://onepass.test/v1", api_key=key, max_retries=0,
                http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))) as c:
            return await c.decisions.create(model="jev-latest", input=STATE,
                                            questions=QUESTIONS[:1])

    with pytest.raises(openai.AuthenticationError):
        asyncio.run(run("wrong"))
    assert asyncio.run(run("right")).answers[0].type == "predicate"


def test_prompt_cache_key_partitions_the_prefix_cache(client, engine):
    state = f"Ticket {uuid.uuid4()}: the parcel arrived broken, please refund it."

    def cached(key):
        d = client.decisions.create(model="jev-latest", input=state, questions=QUESTIONS,
                                    prompt_cache_key=key)
        return d, d.usage.input_tokens_details

    first, a1 = cached("tenant-a")
    assert a1.cached_tokens == engine.pinned_tokens and a1.cache_write_tokens > 0
    second, a2 = cached("tenant-a")
    assert a2.cached_tokens > engine.pinned_tokens and a2.cache_write_tokens == 0
    third, b = cached("tenant-b")  # another key never reads tenant-a's entry
    assert b.cached_tokens == engine.pinned_tokens and b.cache_write_tokens > 0
    fourth, none = cached(None)  # nor does a request without a key
    assert none.cached_tokens == engine.pinned_tokens
    for d in (second, third, fourth):  # the answers do not depend on the cache
        assert d.model_dump()["answers"] == first.model_dump()["answers"]
    assert a1.cached_tokens + a1.cache_write_tokens == a2.cached_tokens


def test_prompt_cache_options_and_safety_identifier_are_accepted(client):
    d = client.decisions.create(model="jev-latest", input=STATE, questions=QUESTIONS[:1],
                                prompt_cache_options={"mode": "explicit", "ttl": "30m"},
                                safety_identifier="user-123")
    assert d.answers[0].type == "predicate"
    with pytest.raises(openai.BadRequestError, match="prompt_cache_options.ttl"):
        client.decisions.create(model="jev-latest", input=STATE, questions=QUESTIONS[:1],
                                extra_body={"prompt_cache_options": {"ttl": "1d"}})
    with pytest.raises(openai.BadRequestError, match="reasoning"):
        client.decisions.create(model="jev-latest", input=STATE, questions=QUESTIONS[:1],
                                extra_body={"reasoning": {"effort": "high"}})


def test_json_schema_decisions_at_the_new_path_and_deprecated_at_the_old(server):
    new = httpx.post(server + "/v1/decisions/schema", json=SCHEMA_BODY, timeout=120)
    assert new.status_code == 200 and "deprecation" not in new.headers
    old = httpx.post(server + "/v1/decisions", json=SCHEMA_BODY, timeout=120)
    assert old.status_code == 200
    assert old.headers["deprecation"] == "true"
    assert old.headers["link"] == '</v1/decisions/schema>; rel="successor-version"'
    assert old.json()["value"] == new.json()["value"]
    assert old.json()["fields"]["refundable"]["probabilities"] == pytest.approx(
        new.json()["fields"]["refundable"]["probabilities"], abs=1e-9)
    # a body with schema and questions is not a legacy body: the OpenAI parser names the fault
    mixed = httpx.post(server + "/v1/decisions", json={**SCHEMA_BODY, "questions": []},
                       timeout=60)
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] in ("model", "input")
