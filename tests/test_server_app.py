"""The HTTP layer in-process, on the real embedded model: a table of bad inputs (status,
message, and a good request still answered afterwards), auth, readiness, load shedding,
disconnects, request ids, metrics, logs and the OpenAPI document."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from onepass.contract import SystemOneRequestModel, SystemOneResponseModel  # noqa: E402
from onepass.server import ServerSettings, create_app  # noqa: E402
from onepass.server.app import ModelList  # noqa: E402

MAX_BODY = 256 * 1024
MAX_QUESTIONS = 8
GOOD = {
    "state": "Hello! How are you today?",
    "questions": {"greeting": {"type": "noul", "instructions": "The text is a greeting."}},
}


def js(value) -> bytes:
    return json.dumps(value).encode()


def q(**question):
    return {"state": "A short note.", "questions": {"a": question}}


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def zstd_bomb() -> bytes:
    c = zstandard.ZstdCompressor().compressobj()
    return b"".join(c.compress(bytes(1 << 22)) for _ in range(32)) + c.flush()


@pytest.fixture(scope="module")
def app(engine):
    return create_app(engine, ServerSettings(max_body_bytes=MAX_BODY, max_questions=MAX_QUESTIONS))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


def assert_good(client):
    r = client.post("/v1/systemone", json=GOOD)
    assert r.status_code == 200, r.text
    assert 0.0 <= r.json()["answers"]["greeting"]["noul"] <= 1.0


# id, method, path, body, headers, status, error type, message fragment
NESTED = {"state": json.loads("[" * 150 + "]" * 150), "questions": GOOD["questions"]}
BAD = [
    ("malformed-json", "POST", "/v1/systemone", b'{"state": "x",', {}, 400, "invalid_json",
     "invalid JSON: Expecting property name"),
    ("empty-body", "POST", "/v1/systemone", b"", {}, 400, "invalid_json", "body is empty"),
    ("not-utf8", "POST", "/v1/systemone", b'{"state": "\xff\xfe"}', {}, 400, "invalid_json",
     "not UTF-8"),
    ("bare-nan", "POST", "/v1/systemone", b'{"state": NaN, "questions": {}}', {}, 400,
     "invalid_json", "bare NaN is not JSON"),
    ("array-body", "POST", "/v1/systemone", js([GOOD]), {}, 422, "invalid_request_error",
     "body: expected a JSON object, got an array"),
    ("missing-state", "POST", "/v1/systemone", js({"questions": GOOD["questions"]}), {}, 422,
     "invalid_request_error", "state: field required"),
    ("null-state", "POST", "/v1/systemone", js({**GOOD, "state": None}), {}, 400,
     "invalid_request_error", "state: expected a string or a JSON value, got null"),
    ("questions-wrong-type", "POST", "/v1/systemone", js({"state": "x", "questions": ["a"]}),
     {}, 422, "invalid_request_error", "questions: expected a non-empty object"),
    ("empty-questions", "POST", "/v1/systemone", js({"state": "x", "questions": {}}), {}, 422,
     "invalid_request_error", "questions: expected at least one question"),
    ("unknown-type", "POST", "/v1/systemone", js(q(type="yesno", instructions="x")), {}, 422,
     "invalid_request_error", "questions.a.type: expected 'noul', 'choice' or 'score'"),
    ("score-11-levels", "POST", "/v1/systemone",
     js(q(type="score", instructions="x", criteria=[str(i) for i in range(11)])), {}, 422,
     "invalid_request_error", "questions.a.criteria: expected 1 to 10 levels, got 11"),
    ("choice-without-criteria", "POST", "/v1/systemone", js(q(type="choice", instructions="x")),
     {}, 422, "invalid_request_error", "questions.a.criteria: expected an object"),
    ("noul-nothing-to-ask", "POST", "/v1/systemone", js(q(type="noul")), {}, 400,
     "invalid_request_error", "a noul question needs 'instructions'"),
    ("unknown-question-field", "POST", "/v1/systemone",
     js(q(type="noul", instructions="x", extra=1)), {}, 422, "invalid_request_error",
     "questions.a.extra: unknown field"),
    ("nan-string-temperature", "POST", "/v1/systemone", js({**GOOD, "temperature": "NaN"}), {},
     422, "invalid_request_error", "temperature: expected a positive number, got a string"),
    ("unknown-debias", "POST", "/v1/systemone", js({**GOOD, "debias": "prior"}), {}, 422,
     "invalid_request_error", "debias"),
    ("box-question", "POST", "/v1/systemone", js(q(type="box", instructions="the cat")), {},
     400, "unsupported_question_type", "'box' questions need a vision-language model"),
    ("image-assets", "POST", "/v1/systemone",
     js({**GOOD, "assets": {"<image:" + "0" * 32 + ">": {"type": "image", "part": "asset-0"}}}),
     {}, 400, "unsupported_asset", "image assets need a vision-language model"),
    ("multipart", "POST", "/v1/systemone", b"--b\r\n\r\n--b--\r\n",
     {"content-type": "multipart/form-data; boundary=b"}, 400, "unsupported_asset",
     "multipart bodies carry image assets"),
    ("duplicate-question-key", "POST", "/v1/systemone",
     b'{"state": "x", "questions": {"a": {"type": "noul", "instructions": "one"}, '
     b'"a": {"type": "noul", "instructions": "two"}}}', {}, 400, "duplicate_key",
     "questions: the key 'a' appears more than once"),
    ("duplicate-key-in-state", "POST", "/v1/systemone",
     b'{"state": {"doc": {"k": 1, "k": 2}}, "questions": {"a": {"type": "noul", '
     b'"instructions": "x"}}}', {}, 400, "duplicate_key", "state.doc: the key 'k'"),
    ("too-deep", "POST", "/v1/systemone", js(NESTED), {}, 400, "invalid_json",
     "nested deeper than 100 levels"),
    ("unknown-model", "POST", "/v1/systemone", js({**GOOD, "model": "gpt-4o"}), {}, 404,
     "model_not_found", "unknown model 'gpt-4o'"),
    ("empty-model", "POST", "/v1/systemone", js({**GOOD, "model": ""}), {}, 400,
     "invalid_request_error", "model: expected a non-empty string"),
    ("too-many-questions", "POST", "/v1/systemone",
     js({"state": "x", "questions": {f"q{i}": {"type": "noul", "instructions": "x"}
                                     for i in range(MAX_QUESTIONS + 1)}}), {}, 413,
     "too_many_questions", f"over the limit of {MAX_QUESTIONS} per request"),
    ("too-many-tokens", "POST", "/v1/systemone",
     js({**GOOD, "state": " ".join(f"w{i}" for i in range(12000))}), {}, 413,
     "max_tokens_exceeded", "over the limit of 8192 (max_input_tokens)"),
    ("huge-body", "POST", "/v1/systemone", js({**GOOD, "state": "x" * (MAX_BODY + 1)}), {},
     413, "request_too_large", f"over the limit of {MAX_BODY} bytes"),
    ("zstd-bomb", "POST", "/v1/systemone", zstd_bomb(), {"content-encoding": "zstd"}, 413,
     "request_too_large", "decoded request body is over the limit"),
    ("gzip-bomb", "POST", "/v1/systemone", gzip.compress(bytes(64 << 20), mtime=0),
     {"content-encoding": "gzip"}, 413, "request_too_large", "decoded request body"),
    ("corrupt-zstd", "POST", "/v1/systemone", zstd(js(GOOD))[:-3],
     {"content-encoding": "zstd"}, 400, "invalid_encoding", "not valid zstd data"),
    ("gzip-label-on-plain-json", "POST", "/v1/systemone", js(GOOD),
     {"content-encoding": "gzip"}, 400, "invalid_encoding", "not valid gzip data"),
    ("unknown-encoding", "POST", "/v1/systemone", js(GOOD), {"content-encoding": "br"}, 415,
     "unsupported_encoding", "Content-Encoding 'br' is not supported"),
    ("get-systemone", "GET", "/v1/systemone", None, {}, 405, "method_not_allowed",
     "GET is not allowed on /v1/systemone; use POST"),
    ("post-models", "POST", "/v1/models", js(GOOD), {}, 405, "method_not_allowed",
     "use GET"),
    ("unknown-route", "GET", "/v2/anything", None, {}, 404, "not_found", "no route GET"),
    ("base-url-with-v1", "POST", "/v1/v1/systemone", js(GOOD), {}, 404, "not_found",
     "base URL must not end in /v1"),
]


@pytest.mark.parametrize(
    "method,path,body,headers,status,kind,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_bad_input(client, method, path, body, headers, status, kind, fragment):
    r = client.request(method, path, content=body, headers=headers)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["error"]["type"] == kind
    assert fragment in payload["error"]["message"], payload["error"]["message"]
    rid = r.headers["x-typesafe-request-id"]
    assert rid.startswith("req_") and payload["error"]["request_id"] == rid
    if status == 422:  # FastAPI-style detail for schema errors, first entry names the field
        assert payload["detail"][0]["loc"][0] == "body" and payload["detail"][0]["msg"]
    if status == 405:
        assert r.headers["allow"]
    assert_good(client)


# Inputs that look odd but are valid: the server must answer them.
ODD_BUT_VALID = [
    ("nan-strings-in-state", {"state": {"x": "NaN", "y": "-Infinity"},
                              "questions": GOOD["questions"]}),
    ("numeric-score-levels", q(type="score", instructions="rate it", criteria=[1, 2, 3])),
    ("one-option-choice", q(type="choice", instructions="pick", criteria={"only": None})),
    ("one-level-score", q(type="score", instructions="rate", criteria=["only"])),
    ("criteria-only-noul", q(type="noul", criteria={"true": "It is short."})),
    ("document-instead-of-state", {"document": "A note.", "questions": GOOD["questions"]}),
    ("debias-extension", {**GOOD, "debias": "rotations+content-free"}),
    ("content-free-one-option", {"state": "x", "debias": "content-free", "questions": {
        "a": {"type": "choice", "instructions": "pick", "criteria": {"only": None}}}}),
    ("extra-body-keys-ignored", {**GOOD, "metadata": {"trace": 1}, "temperature": 0.5}),
    ("json-state-and-instructions", {"state": {"order": 7710, "items": ["vase"]},
                                     "questions": {"a": {"type": "noul",
                                                         "instructions": {"claim": "broken"}}}}),
]


@pytest.mark.parametrize("body", [c[1] for c in ODD_BUT_VALID], ids=[c[0] for c in ODD_BUT_VALID])
def test_odd_but_valid(client, body):
    r = client.post("/v1/systemone", content=js(body), headers={"content-type": "text/plain"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out["answers"]) == set(body["questions"])
    assert isinstance(out["usage"]["input_tokens"], int)
    for answer in out["answers"].values():
        if answer["type"] in ("choice", "score") and len(answer["probabilities"]) == 1:
            assert answer["confidence"] == 1.0
        if answer["type"] == "score":
            assert all(isinstance(v, str) for v in answer["legend"].values())


@pytest.mark.parametrize("coding", ["zstd", "gzip", "deflate", "identity"])
def test_every_documented_encoding_is_accepted(client, coding):
    spec = client.get("/openapi.json").json()["paths"]["/v1/systemone"]["post"]
    (param,) = [p for p in spec["parameters"] if p["name"] == "content-encoding"]
    assert coding in param["schema"]["enum"]
    encode = {"zstd": zstd, "gzip": gzip.compress, "deflate": zlib.compress,
              "identity": lambda b: b}[coding]
    r = client.post("/v1/systemone", content=encode(js(GOOD)),
                    headers={"content-encoding": coding, "content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_openapi_matches_what_is_accepted(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/systemone"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[-1]
    published = doc["components"]["schemas"][name]
    expected = SystemOneRequestModel.model_json_schema(ref_template="#/components/schemas/{model}")
    expected.pop("$defs", None)
    assert published == expected
    for status in ("200", "400", "404", "413", "415", "422", "429", "503"):
        assert status in op["responses"], status
    assert set(doc["paths"]) >= {"/v1/systemone", "/v1/models", "/health", "/health/live",
                                 "/metrics"}
    # A request the schema describes is answered with the documented response shape.
    r = client.post("/v1/systemone", json={**GOOD, "model": "jev-latest"})
    assert r.status_code == 200
    SystemOneResponseModel.model_validate(r.json())
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SystemOneResponseModel")


def test_models_health_live(client, engine):
    r = client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    names = [m["name"] for m in body["models"]]
    assert names == [engine.served_name, "jev-latest"]
    assert [d["id"] for d in body["data"]] == names
    assert all(d["object"] == "model" and d["owned_by"] for d in body["data"])
    assert body["object"] == "list"
    assert all(isinstance(m["release_date"], str) and m["description"] for m in body["models"])
    ModelList.model_validate(body)  # what the OpenAPI document says it returns
    assert "ModelList" in client.get("/openapi.json").json()["components"]["schemas"]
    h = client.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    assert isinstance(h.json()["startup_seconds"], float)
    assert client.get("/health/live").json() == {"status": "ok"}


def test_request_ids_are_unique_and_on_every_response(client):
    ids = set()
    for method, path in [("GET", "/health"), ("GET", "/health/live"), ("GET", "/metrics"),
                         ("GET", "/v1/models"), ("GET", "/nowhere"), ("PUT", "/v1/systemone")]:
        ids.add(client.request(method, path).headers["x-typesafe-request-id"])
    ids.add(client.post("/v1/systemone", json=GOOD).headers["x-typesafe-request-id"])
    assert len(ids) == 7


def test_metrics_report_requests_tokens_cache_and_queue(client):
    client.post("/v1/systemone", json=GOOD)
    text = client.get("/metrics").text
    for needle in [
        'onepass_http_requests_total{method="POST",route="/v1/systemone",status="200"}',
        'onepass_http_request_duration_seconds_bucket{le="0.5",route="/v1/systemone"}',
        'onepass_questions_answered_total{type="noul"}',
        "onepass_input_tokens_total", "onepass_cached_tokens_total",
        "onepass_prefix_cache_hits_total", "onepass_prefix_cache_misses_total",
        "onepass_prefix_cache_evictions_total", "onepass_prefix_cache_resident_tokens",
        "onepass_queue_depth 0.0", "onepass_in_flight_requests", "onepass_queue_wait_seconds",
        "onepass_compute_seconds", "onepass_ready 1.0",
    ]:
        assert needle in text, needle
    line = next(ln for ln in text.splitlines() if ln.startswith("onepass_input_tokens_total"))
    assert float(line.split()[-1]) > 0


def test_access_log_has_one_structured_line_per_request(client, caplog):
    with caplog.at_level(logging.INFO, logger="onepass.access"):
        r = client.post("/v1/systemone", json=GOOD)
    rid = r.headers["x-typesafe-request-id"]
    records = [rec for rec in caplog.records if getattr(rec, "fields", {}).get("request_id") == rid]
    assert len(records) == 1
    fields = records[0].fields
    assert fields["status"] == 200 and fields["questions"] == 1
    assert fields["model"] and fields["input_tokens"] > 0
    for key in ("queue_ms", "compute_ms", "cached_tokens", "cache", "ms"):
        assert key in fields, key


def test_concurrent_requests_about_one_state_share_the_prefix(client, engine, monkeypatch):
    """The four requests reach the model's step scheduler together, every time: its thread is
    held in a step (another request's) until all four wait in its line (an explicit
    condition, not a race between arrivals and steps). Before the scheduler held back a
    decision whose prefix another was still computing, all four were admitted in one go and
    each computed the prefix (4 misses); it passed only when arrivals fell between steps."""
    state = f"Ticket {uuid.uuid4().hex}: the printer on floor 3 is jammed again."
    body = {"state": state, "questions": {
        "hw": {"type": "noul", "instructions": "This is a hardware problem."},
        "prio": {"type": "score", "instructions": "Priority", "criteria": ["low", "high"]}}}
    steps = engine.generator.scheduler
    real_step, in_step, gate = engine.backend.step, threading.Event(), threading.Event()

    def held_step(arena, rows):
        in_step.set()
        assert gate.wait(30)
        return real_step(arena, rows)

    monkeypatch.setattr(engine.backend, "step", held_step)
    with ThreadPoolExecutor(5) as pool:
        try:
            other = pool.submit(client.post, "/v1/systemone", json=GOOD)
            assert in_step.wait(30), "the step scheduler never ran the first request"
            before = engine.backend.cache_stats()
            futures = [pool.submit(client.post, "/v1/systemone", json=body) for _ in range(4)]
            deadline = time.monotonic() + 30
            while steps.decisions_waiting < 4:
                assert time.monotonic() < deadline, "the four requests never reached the model"
                time.sleep(0.01)
        finally:
            gate.set()
        responses = [f.result() for f in futures]
        assert other.result().status_code == 200
    after = engine.backend.cache_stats()
    assert [r.status_code for r in responses] == [200] * 4
    computed = (after.misses - before.misses) + (after.partial_hits - before.partial_hits)
    assert computed == 1, "the state's prefix was computed more than once"
    assert after.hits - before.hits == 3
    answers = [r.json()["answers"]["hw"]["noul"] for r in responses]
    assert max(answers) - min(answers) < 1e-4
    cached = sorted(r.json()["usage"]["cached_tokens"] for r in responses)
    assert cached[0] < cached[1] == cached[3]


def asgi_scope(path: str = "/v1/systemone") -> dict:
    """An HTTP scope for calling the app directly (to play a slow or vanishing client)."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


def _occupy_worker(app):
    """Hold the single engine worker with a job until the returned event is set."""
    gate, started = threading.Event(), threading.Event()

    def hold():
        started.set()
        gate.wait(20)

    app.state.runtime.queue.submit(hold)
    assert started.wait(10)
    return gate


def test_saturation_sheds_with_retry_after_then_recovers(engine):
    app = create_app(engine, ServerSettings(workers=1, max_queue=1, request_deadline=0.3))
    with TestClient(app) as c:
        gate = _occupy_worker(app)
        try:
            with ThreadPoolExecutor(4) as pool:
                responses = list(pool.map(lambda _: c.post("/v1/systemone", json=GOOD), range(4)))
        finally:
            gate.set()
        assert [r.status_code for r in responses] == [429] * 4
        for r in responses:
            assert r.json()["error"]["type"] == "overloaded"
            assert int(r.headers["retry-after-ms"]) > 0 and int(r.headers["retry-after"]) >= 1
        messages = " ".join(r.json()["error"]["message"] for r in responses)
        assert "max_queue=1" in messages  # refused at once: queue full
        assert "request deadline" in messages  # the queued one: deadline passed
        metrics = c.get("/metrics").text
        assert 'onepass_requests_shed_total{reason="queue_full"}' in metrics
        assert 'onepass_requests_shed_total{reason="deadline"} 1.0' in metrics
        assert c.post("/v1/systemone", json=GOOD).status_code == 200


def test_disconnected_client_costs_no_compute(engine):
    app = create_app(engine, ServerSettings(workers=1))
    gate = _occupy_worker(app)
    sent = []

    async def call():
        messages = [{"type": "http.request", "body": js(GOOD), "more_body": False},
                    {"type": "http.disconnect"}]

        async def receive():
            if len(messages) == 1:
                await asyncio.sleep(0.2)  # the client hangs up while the request is queued
            return messages.pop(0)

        async def send(message):
            sent.append(message)

        await app(asgi_scope(), receive, send)

    before = engine.stats.requests
    try:
        asyncio.run(call())
    finally:
        gate.set()
    time.sleep(0.3)
    assert sent == []  # nothing to send to a client that is gone
    assert engine.stats.requests == before  # the engine never saw it
    rt = app.state.runtime
    assert rt.queue.depth == 0
    assert rt.metrics.shed.labels("disconnected")._value.get() == 1


def test_auth_with_api_key(engine):
    app = create_app(engine, ServerSettings(api_key="s3cret-key"))
    with TestClient(app) as c:
        missing = c.post("/v1/systemone", json=GOOD)
        assert missing.status_code == 403
        assert missing.json()["error"]["type"] == "missing_api_key"
        assert "Must supply an API key" in missing.json()["error"]["message"]
        wrong = c.post("/v1/systemone", json=GOOD, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        basic = c.get("/v1/models", headers={"authorization": "Basic czNjcmV0LWtleQ=="})
        assert basic.status_code == 403
        ok = c.post("/v1/systemone", json=GOOD, headers={"authorization": "Bearer s3cret-key"})
        assert ok.status_code == 200
        assert c.get("/health").status_code == 200  # probes need no key
        assert "HTTPBearer" in c.get("/openapi.json").json()["components"]["securitySchemes"]


def test_without_api_key_any_token_or_none_is_accepted(client):
    for headers in ({}, {"authorization": "Bearer local"}, {"authorization": "Bearer x y"}):
        assert client.post("/v1/systemone", json=GOOD, headers=headers).status_code == 200


def test_listens_before_the_model_is_ready(engine):
    release = threading.Event()

    def loader():
        release.wait(20)
        return engine

    app = create_app(loader, ServerSettings())
    with TestClient(app) as c:
        assert c.get("/health/live").status_code == 200
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "loading"
        r = c.post("/v1/systemone", json=GOOD)
        assert r.status_code == 503 and r.json()["error"]["type"] == "model_loading"
        assert int(r.headers["retry-after-ms"]) > 0
        assert c.get("/v1/models").status_code == 503
        release.set()
        deadline = time.monotonic() + 10
        while c.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/health").json()["status"] == "ok"
        assert c.post("/v1/systemone", json=GOOD).status_code == 200


def test_model_that_fails_to_load_is_reported(engine):
    failed = threading.Event()

    def loader():
        raise FileNotFoundError("no checkpoint at /nowhere")

    app = create_app(loader, ServerSettings())
    app.state.runtime.on_load_failure = failed.set
    with TestClient(app) as c:
        assert failed.wait(5)
        h = c.get("/health")
        assert h.status_code == 503 and "no checkpoint at /nowhere" in h.json()["error"]
        r = c.post("/v1/systemone", json=GOOD)
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]


class _FaultyEngine:
    """Not a stand-in for the model: a deliberately broken engine, to see a server fault."""

    served_name = "broken"

    def check_model(self, requested):
        return None

    def answer(self, request):
        raise RuntimeError("boom")


def test_server_fault_is_500_with_request_id_and_logged(caplog):
    app = create_app(_FaultyEngine(), ServerSettings())
    with TestClient(app, raise_server_exceptions=False) as c, caplog.at_level(logging.ERROR):
        r = c.post("/v1/systemone", json=GOOD)
        assert c.get("/health/live").status_code == 200  # still up
    assert r.status_code == 500
    rid = r.headers["x-typesafe-request-id"]
    assert r.json()["error"] == {"message": "internal server error; it has been logged with "
                                 "this request id", "type": "internal_error", "request_id": rid}
    faults = [rec for rec in caplog.records if rec.getMessage() == "server fault"]
    assert faults and faults[0].fields["request_id"] == rid and faults[0].exc_info


def test_decisions_route_when_schema_module_is_present(client):
    pytest.importorskip("onepass.schema")
    body = {"context": "Hotel bill, 300 EUR, conference trip.", "mode": "batch",
            "schema": {"type": "object", "properties": {
                "category": {"enum": ["meal", "travel"]},
                "refundable": {"type": "boolean", "description": "Is it refundable?"}}}}
    r = client.post("/v1/decisions/schema", content=zstd(js(body)),
                    headers={"content-encoding": "zstd"})
    assert r.status_code == 200, r.text
    assert set(r.json()["value"]) == {"category", "refundable"}
    bad = client.post("/v1/decisions/schema", json={**body, "mode": "sideways"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "mode"
    assert client.post("/v1/decisions/schema", json={**body, "model": "nope"}).status_code == 404


def test_draining_refuses_new_work_and_fails_readiness(engine):
    app = create_app(engine, ServerSettings())
    with TestClient(app) as c:
        assert c.post("/v1/systemone", json=GOOD).status_code == 200
        app.state.runtime.begin_drain("test")
        r = c.post("/v1/systemone", json=GOOD)
        assert r.status_code == 503 and r.json()["error"]["type"] == "shutting_down"
        assert int(r.headers["retry-after-ms"]) > 0
        assert c.get("/health").json() == {"status": "draining"}
        assert c.get("/health/live").status_code == 200


def _asgi_post(app, receive, path="/v1/systemone"):
    """Call the app directly with a hand-made receive."""
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(app(asgi_scope(path), receive, send))
    return sent


def test_trickled_body_times_out_with_408(engine, monkeypatch):
    import onepass.server.body as server_body

    monkeypatch.setattr(server_body, "BODY_READ_TIMEOUT", 0.2)
    app = create_app(engine, ServerSettings())

    async def receive():
        await asyncio.sleep(0.5)
        return {"type": "http.request", "body": b"{", "more_body": True}

    sent = _asgi_post(app, receive)
    assert sent[0]["status"] == 408
    assert b"did not arrive within 0.2 s" in sent[1]["body"]


def test_request_cut_by_the_drain_deadline_gets_503_and_is_counted(engine, caplog):
    app = create_app(engine, ServerSettings(workers=1))
    rt = app.state.runtime
    gate = _occupy_worker(app)
    sent = []

    async def call():
        body = [{"type": "http.request", "body": js(GOOD), "more_body": False}]

        async def receive():
            if body:
                return body.pop()
            await asyncio.sleep(3600)  # the client stays connected

        async def send(message):
            sent.append(message)

        task = asyncio.ensure_future(app(asgi_scope(), receive, send))
        while rt.queue.depth == 0:  # queued behind the busy worker
            await asyncio.sleep(0.01)
        task.cancel()  # what uvicorn does when the drain deadline passes
        await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(call())
    finally:
        gate.set()
    assert sent[0]["status"] == 503
    assert b"shut down before this request was answered" in sent[1]["body"]
    assert rt.abandoned == 1 and rt.queue.depth == 0  # dropped from the queue too
    with caplog.at_level(logging.INFO, logger="onepass.server"):
        rt.shutdown()
    (done,) = [r for r in caplog.records if r.getMessage() == "shutdown complete"]
    assert done.fields["abandoned"] == 1


# --------------------------------------------------------------------------- decisions bounds

DECISIONS = {"context": "Hotel bill, 300 EUR, conference trip.", "mode": "sequential",
             "schema": {"type": "object", "properties": {
                 "category": {"enum": ["meal", "travel"]},
                 "refundable": {"type": "boolean", "description": "Is it refundable?"}}}}


def _fan_out(depth: int) -> dict:
    """A 3 KB schema whose references expand to 2**depth empty objects."""
    ref = {"type": "object", "properties": {}}
    defs = {f"L{depth}": ref}
    for i in range(depth):
        defs[f"L{i}"] = {"type": "object", "properties": {
            "a": {"$ref": f"#/$defs/L{i + 1}"}, "b": {"$ref": f"#/$defs/L{i + 1}"}}}
    return {"$defs": defs, "type": "object", "properties": {"x": {"$ref": "#/$defs/L0"}}}


def test_decisions_are_validated_and_compiled_before_they_are_queued(engine):
    """With the only engine worker held, refusals still come at once: nothing about them was
    queued (before, the body waited behind the worker and was shed with 429 at the deadline,
    or compiled for hours on the worker: depth 30 is 2**30 objects)."""
    app = create_app(engine, ServerSettings(workers=1, max_questions=8, request_deadline=0.5))
    with TestClient(app) as c:
        gate = _occupy_worker(app)
        try:
            bomb = c.post("/v1/decisions/schema", json={**DECISIONS, "schema": _fan_out(30)})
            wide = c.post("/v1/decisions/schema", json={**DECISIONS, "schema": {"properties": {
                f"f{i}": {"type": "boolean"} for i in range(9)}}})
            steps = c.post("/v1/decisions/schema", json={**DECISIONS, "schema": {"properties": {
                "n": {"type": "number", "minimum": 0, "maximum": 1e300,
                      "multipleOf": 1e-300}}}})
            depth = app.state.runtime.queue.depth
        finally:
            gate.set()
    assert depth == 0
    assert bomb.status_code == 400, bomb.text
    assert "steps to compile" in bomb.json()["error"]["message"]
    assert bomb.json()["error"]["field"].startswith("schema.properties.x.properties.")
    assert wide.status_code == 413 and wide.json()["error"]["type"] == "too_many_questions"
    assert "9 fields is over the limit of 8" in wide.json()["error"]["message"]
    assert steps.status_code == 400 and steps.json()["error"]["field"] == "schema.properties.n"


def test_hostile_numbers_are_client_errors_not_500(client):
    """JSON integers past a double, steps past it, a temperature whose logits/t overflows:
    each once raised OverflowError or produced NaN, a 500 the official client retries."""
    huge = client.post("/v1/systemone", content=js({**GOOD, "temperature": 10**400}))
    assert huge.status_code == 422 and huge.json()["error"]["field"] == "temperature"
    assert "finite number" in huge.json()["error"]["message"]
    tiny = client.post("/v1/systemone", json={**GOOD, "temperature": 1e-320})
    assert tiny.status_code == 200 and tiny.json()["answers"]["greeting"]["noul"] in (0.0, 1.0)
    for bad in ({"type": "number", "minimum": 0, "maximum": 1e300, "x-step": 1e-300},
                {"type": "integer", "minimum": 0, "maximum": 10**400}):
        r = client.post("/v1/decisions/schema", content=js(
            {**DECISIONS, "schema": {"properties": {"n": bad}}}))
        assert r.status_code == 400 and r.json()["error"]["field"] == "schema.properties.n"
    r = client.post("/v1/decisions/schema", content=js({**DECISIONS, "temperature": 10**400}))
    assert r.status_code == 422 and r.json()["error"]["field"] == "temperature"
    assert_good(client)


def test_decisions_bound_open_text_and_wall_time(client, monkeypatch):
    from onepass.schema import wire  # parse_decisions reads the bound there

    wide = {**DECISIONS, "max_open_tokens": 512, "schema": {"properties": {
        f"t{i}": {"type": "string", "x-open": True} for i in range(5)}}}
    r = client.post("/v1/decisions/schema", json=wide)
    assert r.status_code == 413 and r.json()["error"]["type"] == "max_tokens_exceeded"
    assert r.json()["error"]["field"] == "max_open_tokens"
    monkeypatch.setattr(wire, "MAX_DECISION_SECONDS", 0.0)  # every run is past it at once
    r = client.post("/v1/decisions/schema", json=DECISIONS)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert "time limit of 0 s per request after 0 of 2 fields" in r.json()["error"]["message"]
    monkeypatch.undo()
    assert client.post("/v1/decisions/schema", json=DECISIONS).status_code == 200
