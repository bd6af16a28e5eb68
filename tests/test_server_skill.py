"""``GET /.skill`` and the 404 route list: both come from the app itself (its route table,
its OpenAPI document, its settings), so a route, a field or a limit cannot go missing."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel, Field, create_model  # noqa: E402

from onepass.server import ServerSettings, create_app  # noqa: E402
from onepass.server.skill import (  # noqa: E402
    PATH,
    example_body,
    model_limits,
    render,
    server_limits,
)

FRAMEWORK = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", PATH}


def _never_loads():
    raise AssertionError("these tests never load a model")


def app_routes(app) -> set[tuple[str, str]]:
    return {(method, route.path) for route in app.routes
            for method in (getattr(route, "methods", None) or ()) if method != "HEAD"}


def skill(settings: ServerSettings | None = None) -> tuple[object, str]:
    app = create_app(_never_loads, settings)
    response = TestClient(app).get(PATH)  # no lifespan: the loader is never called
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/markdown")
    return app, response.text


def test_every_route_of_the_app_is_in_the_skill():
    app, text = skill()
    routes = {r for r in app_routes(app) if r[1] not in FRAMEWORK}
    assert {("POST", "/v1/systemone"), ("POST", "/v1/chat/completions"),
            ("GET", "/v1/responses/{response_id}/input_items"), ("GET", "/metrics")} <= routes
    for method, path in routes:
        assert f"### `{method} {path}`" in text, (method, path)
    # each POST route has its body's fields, a status table and a runnable example
    for section in text.split("\n## Routes\n")[1].split("\n### ")[1:]:
        head = section.splitlines()[0]
        assert "| status | meaning |" in section, head
        assert "```sh\ncurl -sS" in section, head
        if head.startswith("`POST"):
            assert "Request body (JSON)" in section and "| field |" in section, head
            assert "-d '{" in section, head
    chat = text.split("### `POST /v1/chat/completions`")[1].split("\n### ")[0]
    assert "| `temperature` | number in [0, 2] | no | 1.0 |" in chat
    assert "| `messages` | array (1 to 1024 items) of `ChatMessage` | yes |" in chat
    assert "`ChatMessage`:" in chat and "| `role` | one of `\"system\"`" in chat
    assert "| 429 |" in chat and "`OpenAIErrorResponse`" in chat
    # the error envelope and the type table
    assert '{"error": {"message", "type", "field", "request_id"}}' in text
    assert "| `too_many_questions` | 413 |" in text and "| `overloaded` | 429 |" in text
    assert "`ErrorBody`:" in text and "| `request_id` | string | no |" in text


def test_the_skill_is_public_and_says_which_routes_need_the_key():
    app, text = skill(ServerSettings(api_key="sekrit"))
    assert "sekrit" not in text
    assert "`Authorization: Bearer <key>`" in text
    systemone = text.split("### `POST /v1/systemone`")[1].split("\n### ")[0]
    assert "- Auth: Bearer" in systemone and "$ONEPASS_API_KEY" in systemone
    live = text.split("### `GET /health/live`")[1].split("\n### ")[0]
    assert "- Auth: none" in live and "$ONEPASS_API_KEY" not in live
    open_app, open_text = skill()
    assert "- Auth: Bearer" not in open_text and "no route needs one" in open_text


def test_the_limits_shown_are_the_settings_in_force():
    settings = ServerSettings(max_body_bytes=123457, max_questions=7, max_queue=3,
                              request_deadline=2.5, workers=2)
    _, text = skill(settings)
    section = text.split("## Limits in force")[1].split("\n## ")[0]
    shown = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section, re.M))
    names = {f.name for f in dataclasses.fields(ServerSettings)}
    assert set(shown) == {lim.name for lim in server_limits(settings)} and set(shown) <= names
    for name, value in shown.items():
        assert value == str(getattr(settings, name)), name
    assert "still loading" in section  # no model yet: no made-up token limits


def test_each_served_models_token_limits_are_shown():
    gen = SimpleNamespace(context_length=2048, default_max_output_tokens=99,
                          scheduler=SimpleNamespace(max_sequences=3, max_waiting=5))
    runtime = SimpleNamespace(engines={"small": SimpleNamespace(max_input_tokens=777,
                                                                generator=gen)})
    rows = model_limits(runtime)
    assert rows == [{"model": "small", "max_input_tokens": 777, "context_tokens": 2048,
                     "default_max_output_tokens": 99, "generation_slots": 3,
                     "generation_waiting_line": 5}]
    text = render({"info": {"title": "t", "version": "1"}, "paths": {}},
                  server_limits(ServerSettings()), rows)
    assert "| `small` | 777 | 2048 | 99 | 3 | 5 |" in text
    assert model_limits(SimpleNamespace(engines={})) == []


class Inner(BaseModel):
    label: str = Field(min_length=2, description="A label")


def synthetic_doc(body: type[BaseModel]) -> dict:
    """A tiny OpenAPI document whose one route takes ``body``, built as app.openapi() does."""
    schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.pop("$defs", {})
    components[body.__name__] = schema
    return {
        "info": {"title": "tiny", "version": "0"},
        "paths": {"/v1/thing": {"post": {
            "summary": "Make a thing",
            "requestBody": {"content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}},
            "responses": {"200": {"description": "Made"},
                          "400": {"description": "Bad thing", "content": {"application/json": {
                              "schema": {"$ref": "#/components/schemas/Oops"}}}}},
        }}},
        "components": {"schemas": {**components, "Oops": {
            "type": "object", "properties": {"error": {"type": "string"}},
            "required": ["error"]}}},
    }


def test_a_field_added_to_a_request_model_appears_without_touching_skill():
    Thing = create_model("Thing", size=(int, Field(ge=1, le=9, description="How big")),
                         inner=(Inner | None, None))
    before = render(synthetic_doc(Thing), [])
    assert "### `POST /v1/thing`" in before and "Make a thing." in before
    assert "| `size` | integer in [1, 9] | yes |  | How big |" in before
    assert "| `inner` | `Inner` | no | null |" in before
    assert "| `label` | string (at least 2 characters) | yes |  | A label |" in before
    assert "| 400 | Bad thing (`Oops`) |" in before and "`Oops`:" in before
    assert "color" not in before
    Bigger = create_model("Thing", __base__=Thing, color=(
        str, Field(pattern="^#[0-9a-f]{6}$", description="Hex colour")))
    after = render(synthetic_doc(Bigger), [])
    assert "| `color` | string matching `^#[0-9a-f]{6}$` | yes |  | Hex colour |" in after
    # the example is built from the required fields when the schema has none
    op = synthetic_doc(Bigger)["paths"]["/v1/thing"]["post"]
    assert set(example_body(synthetic_doc(Bigger), op)) == {"size", "color"}
    assert '"color"' in after.split("```sh")[1]


def test_404_lists_the_routes_of_the_app_itself():
    app = create_app(_never_loads, ServerSettings(playground=False))

    @app.get("/v1/added-later", summary="A route the 404 message was never told about")
    async def added() -> dict:
        return {}

    response = TestClient(app).get("/v2/nothing")
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert message.startswith("no route GET /v2/nothing; this server answers ")
    assert "GET /v1/added-later" in message
    assert "GET/DELETE /v1/responses/{response_id}" in message
    for method, path in app_routes(app):
        if path not in FRAMEWORK - {PATH} and path != "/v1/responses/{response_id}":
            assert f"{method} {path}" in message, (method, path)
    assert "GET /," not in message and "/openapi.json" not in message  # playground off


def test_every_example_is_answered_by_the_real_server(engine):
    """The curl examples work: each POST body is sent to the server on the real model."""
    settings = ServerSettings()
    app = create_app(engine, settings)
    with TestClient(app) as client:
        text = client.get(PATH).text
        doc = app.openapi()
        posts = [(path, item["post"]) for path, item in doc["paths"].items() if "post" in item]
        assert len(posts) >= 5
        for path, op in posts:
            response = client.post(path, json=example_body(doc, op))
            assert response.status_code == 200, (path, response.text)
    table = text.split("### Models")[1].split("\n## ")[0]
    assert f"| `{engine.served_name}` | {engine.max_input_tokens} |" in table


def test_the_base_url_is_the_configured_address_never_the_host_header():
    """A client writes the Host header: an injected host must not reach the examples an agent
    runs (issue 25, item 10; it did: `Base URL: http://evil.example:666`)."""
    for settings, base in ((None, "http://127.0.0.1:8080"),
                           (ServerSettings(host="::1", port=9001), "http://[::1]:9001"),
                           (ServerSettings(host="0.0.0.0", public_url="https://api.example/op/"),
                            "https://api.example/op")):
        app = create_app(_never_loads, settings)
        text = TestClient(app).get(PATH, headers={"host": "evil.example:666"}).text
        assert "evil.example" not in text
        assert f"Base URL: `{base}`" in text and "not the Host header" in text
        assert f"curl -sS {base}/health/live" in text
    with pytest.raises(ValueError, match="public_url"):
        ServerSettings(public_url="javascript:alert(1)")


def test_no_cdn_loaded_docs_page_and_the_openapi_document_stays():
    client = TestClient(create_app(_never_loads))
    for page in ("/docs", "/redoc"):
        assert client.get(page).status_code == 404
    doc = client.get("/openapi.json")
    assert doc.status_code == 200 and "/v1/systemone" in doc.json()["paths"]
