"""`/metrics` label cardinality: whatever methods, paths and statuses clients send, the number
of time series stays bounded (a client must not be able to grow the server's memory or the
scraper's storage one request at a time). Needs no model: 404/405 never reach the engine."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from onepass.server import ServerSettings, create_app  # noqa: E402
from onepass.server.metrics import HTTP_METHODS, OTHER, UNMATCHED, Metrics  # noqa: E402

SERIES = re.compile(r'^onepass_http_requests_total\{method="([^"]*)",route="([^"]*)",'
                    r'status="([^"]*)"\} ', re.M)
LATENCY = re.compile(r'^onepass_http_request_duration_seconds_count\{route="([^"]*)"\} ', re.M)


def never_loads():
    raise FileNotFoundError("no model in this test: the routes under test never need one")


def test_hostile_methods_and_paths_create_a_bounded_number_of_series():
    app = create_app(never_loads, ServerSettings())
    real_routes = {route.path for route in app.routes}
    with TestClient(app) as c:
        for i in range(150):
            assert c.request(f"X-BOGUS{i}", "/v1/systemone").status_code == 405
            assert c.request(f"M{i}", f"/no/such/path/{i}").status_code == 404
            assert c.get(f"/v1/unknown-{i}").status_code == 404
        text = c.get("/metrics").text
    series = SERIES.findall(text)
    methods = {m for m, _, _ in series}
    routes = {r for _, r, _ in series}
    assert methods <= HTTP_METHODS | {OTHER}, methods
    assert OTHER in methods and "GET" in methods
    assert routes <= real_routes | {UNMATCHED}, routes
    assert {"/v1/systemone", UNMATCHED} <= routes
    # 450 distinct (method, path) pairs above; a handful of series describe them all
    assert len(series) <= 6, series
    assert set(LATENCY.findall(text)) <= real_routes | {UNMATCHED}


def test_every_label_takes_its_value_from_a_fixed_set():
    m = Metrics()
    m.observe_http("/v1/systemone", "BREW", 418, 0.01)
    m.observe_http("/v1/systemone", "POST", 999, 0.01)
    m.observe_http("/v1/systemone", "POST", 0, 0.01)
    m.observe_http("/v1/systemone", "POST", 499, 0.01)
    m.observe_answer({"answers": {"a": {"type": "noul"}, "b": {"type": "<script>"},
                                  "c": {"type": 7}}, "usage": {}}, 0.0, 0.0)
    text = m.render()[0].decode()
    assert set(SERIES.findall(text)) == {
        (OTHER, "/v1/systemone", "418"),
        ("POST", "/v1/systemone", OTHER),
        ("POST", "/v1/systemone", "499"),
    }
    assert 'onepass_questions_answered_total{type="noul"} 1.0' in text
    assert 'onepass_questions_answered_total{type="other"} 2.0' in text
    assert "<script>" not in text
