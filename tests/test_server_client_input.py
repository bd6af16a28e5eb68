"""Client input that answered 500 (issue 25, item 9): integers past Python's 4,300-digit
int/str limit, lone UTF-16 surrogates in text, a 5,000-digit ``logit_bias`` key, non-ASCII
digits in ``input_items?limit=``, a non-string ``rid``. Each is a 400 naming the field, on
every route it reaches (the real app and model)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from onepass.server.app import create_app  # noqa: E402
from onepass.server.body import MAX_INT_DIGITS, parse_json  # noqa: E402
from onepass.server.errors import ApiError  # noqa: E402
from onepass.server.settings import ServerSettings  # noqa: E402


def _fill(template: str, *values: str) -> str:
    """``template`` with each ``%s`` replaced by the next value (JSON braces stay as they are)."""
    for value in values:
        template = template.replace("%s", value, 1)
    return template


BIG = "1" * 5000  # past int's 4,300-digit str conversion limit
NOUL = '{"a":{"type":"noul","instructions":"Is it late?"}}'
CHAT = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,%s}'
GENERATE = '{"input_ids":[[1,2]],"token_ids_logprob":[3],"sampling_params":{"max_new_tokens":0},%s}'

# (route, raw JSON body, the field the 400 must name)
HUGE_INTS = [
    ("/v1/chat/completions", CHAT % f'"seed":{BIG}', "seed"),
    ("/v1/chat/completions", CHAT % f'"max_tokens":-{BIG}', "max_tokens"),
    ("/v1/completions", _fill('{"prompt":"hi","max_tokens":%s}', BIG), "max_tokens"),
    ("/v1/completions", _fill('{"prompt":[1,%s],"max_tokens":1}', BIG), "prompt[1]"),
    ("/v1/responses", _fill('{"input":"hi","max_output_tokens":%s}', BIG), "max_output_tokens"),
    ("/v1/systemone", _fill('{"state":"x","questions":%s,"seed":%s}', NOUL, BIG), "seed"),
    ("/v1/decisions/schema", _fill('{"context":"x","mode":"batch","schema":{"type":"object",'
     '"properties":{"n":{"type":"integer","maximum":%s}}}}', BIG), "schema.properties.n.maximum"),
    ("/v1/decisions", _fill('{"model":"m","input":"x","questions":[{"type":"predicate",'
     '"instructions":"i","name":%s}]}', BIG), "questions[0].name"),
    ("/v1/embeddings", _fill('{"input":[%s]}', BIG), "input[0]"),
    ("/generate", GENERATE % f'"rid":{BIG}', "rid"),
    ("/generate", _fill('{"input_ids":[[1,%s]],"token_ids_logprob":[3]}', BIG), "input_ids[0][1]"),
]

S = "\\ud800"  # a lone high surrogate, as JSON writes it
LONE_SURROGATES = [
    ("/v1/chat/completions", _fill('{"messages":[{"role":"user","content":"hi %s"}]}', S),
     "messages[0].content"),
    ("/v1/chat/completions", _fill('{"messages":[{"role":"user","content":[{"type":"text","text":'
     '"%s"}]}]}', S), "messages[0].content[0].text"),
    ("/v1/chat/completions", CHAT % f'"stop":["ok","{S}"]', "stop[1]"),
    ("/v1/chat/completions", CHAT % ('"tools":[{"type":"function","function":{"name":"f",'
                                     f'"description":"{S}"}}}}]'),
     "tools[0].function.description"),
    ("/v1/chat/completions", CHAT % f'"response_format":{{"type":"json_schema","json_schema":'
     f'{{"name":"n","schema":{{"enum":["{S}"]}}}}}}',
     "response_format.json_schema.schema.enum[0]"),
    ("/v1/completions", _fill('{"prompt":"hi %s","max_tokens":1}', S), "prompt"),
    ("/v1/completions", _fill('{"prompt":["ok","%s"],"max_tokens":1}', S), "prompt[1]"),
    ("/v1/completions", _fill('{"prompt":"hi","max_tokens":1,"stop":"%s"}', S), "stop"),
    ("/v1/responses", _fill('{"input":"hi %s","max_output_tokens":1}', S), "input"),
    ("/v1/responses", '{"input":"hi","instructions":"\\udfff","max_output_tokens":1}',
     "instructions"),
    ("/v1/responses", _fill('{"input":[{"role":"user","content":[{"type":"input_text","text":'
     '"%s"}]}]}', S), "input[0].content[0].text"),
    ("/v1/responses", _fill('{"input":"hi","metadata":{"k":"%s"}}', S), "metadata.k"),
    ("/v1/systemone", _fill('{"state":"late %s","questions":%s}', S, NOUL), "state"),
    ("/v1/systemone", _fill('{"state":{"ticket":"%s"},"questions":%s}', S, NOUL), "state.ticket"),
    ("/v1/systemone", _fill('{"state":"x","questions":{"a":{"type":"noul",'
                            '"instructions":"%s"}}}', S),
     "questions.a.instructions"),
    ("/v1/systemone", _fill('{"state":"x","questions":{"a":{"type":"choice","instructions":"i",'
     '"criteria":{"ok":"%s","no":null}}}}', S), "questions.a.criteria.ok"),
    ("/v1/decisions/schema", _fill('{"context":"late %s","mode":"batch","schema":{"type":"object",'
     '"properties":{"u":{"type":"boolean"}}}}', S), "context"),
    ("/v1/decisions", _fill('{"model":"m","input":[{"role":"user","content":"late %s"}],'
     '"questions":[{"type":"predicate","instructions":"i"}]}', S), "input[0].content"),
    ("/v1/decisions/schema", _fill('{"context":"x","mode":"batch","schema":{"type":"object",'
     '"properties":{"u":{"type":"boolean","description":"%s"}}}}', S),
     "schema.properties.u.description"),
    ("/v1/embeddings", _fill('{"input":"a %s"}', S), "input"),
    ("/v1/embeddings", _fill('{"input":["ok","%s"]}', S), "input[1]"),
    ("/generate", GENERATE % f'"rid":"{S}"', "rid"),
]


@pytest.fixture(scope="module")
def client(engine):
    app = create_app(engine, ServerSettings(request_deadline=30))
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c
    finally:
        if engine._generator is not None:
            engine._generator.scheduler.close()
        engine._generator = None
        engine.scorer = None


def _refused(client, route: str, raw: str, field: str) -> str:
    r = client.post(route, content=raw.encode("utf-8"),
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, (route, r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["field"] == field, (route, error)
    assert error["message"].startswith(field + ":"), error
    return error["message"]


@pytest.mark.parametrize("route, raw, field", HUGE_INTS, ids=[f for _, _, f in HUGE_INTS])
def test_huge_integers_are_a_400_naming_the_field(client, route, raw, field):
    message = _refused(client, route, raw, field)
    assert f"over the limit of {MAX_INT_DIGITS} digits" in message


@pytest.mark.parametrize("route, raw, field", LONE_SURROGATES,
                         ids=[f"{r}:{f}" for r, _, f in LONE_SURROGATES])
def test_lone_surrogates_are_a_400_naming_the_field(client, route, raw, field):
    assert "lone UTF-16 surrogate" in _refused(client, route, raw, field)


def test_surrogate_pairs_and_long_but_bounded_integers_still_work(client):
    r = client.post("/v1/completions", content=json.dumps(
        {"prompt": "smile \U0001f600", "max_tokens": 1, "temperature": 0}))
    assert r.status_code == 200, r.text
    body = _fill('{"prompt":"hi","max_tokens":1,"seed":%s}', "9" * MAX_INT_DIGITS)
    r = client.post("/v1/completions", content=body)
    assert r.status_code == 400 and r.json()["error"]["field"] == "seed", r.text  # range check
    assert "digits" not in r.json()["error"]["message"]


def test_logit_bias_key_of_5000_digits_is_a_400(client):
    for route, body in (("/v1/chat/completions", CHAT % f'"logit_bias":{{"{BIG}":1}}'),
                        ("/v1/completions", '{"prompt":"hi","max_tokens":1,"logit_bias":'
                         f'{{"{BIG}":1}}}}')):
        message = _refused(client, route, body, "logit_bias")
        assert "at most 10 digits" in message and "5000 characters" in message


def test_input_items_limit_takes_ascii_digits_only(client):
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1,
                                           "store": True})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    for limit in ("²", "٣", "1" * 5000, "+3", " 3", "3.0"):
        r = client.get(f"/v1/responses/{rid}/input_items", params={"limit": limit})
        assert r.status_code == 400, (limit, r.status_code, r.text[:200])
        assert r.json()["error"]["field"] == "limit"
    r = client.get(f"/v1/responses/{rid}/input_items", params={"limit": "3"})
    assert r.status_code == 200 and len(r.json()["data"]) == 1


def test_generate_rid_must_be_a_string(client):
    for rid in ("[1]", '["a","b"]', '{"a":1}', "7"):
        _refused(client, "/generate", GENERATE % f'"rid":{rid}', "rid")
    r = client.post("/generate", content=GENERATE % '"rid":"mine"')
    assert r.status_code == 200 and r.json()[0]["meta_info"]["id"] == "mine", r.text


# --------------------------------------------------------------------------- parse_json (pure)


def _fault(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert info.value.status == 400
    return info.value


def test_parse_json_names_the_path_of_each_bad_value():
    assert _fault(b'{"a":[1,{"b":"x\\ud800"}]}').field == "a[1].b"
    assert _fault(b'{"a":[0,-' + b"9" * (MAX_INT_DIGITS + 1) + b"]}").field == "a[1]"
    assert _fault(b'{"a":{"b":1e400}}').field == "a.b"  # overflows to Infinity
    assert _fault(b'{"a":-1' + b"0" * 400 + b'.5}').field == "a"
    assert _fault(b'{"k\\udc00":1}').field == "body"  # a bad key: its object (the body)
    assert _fault(b'[{"x":{"\\ud800":1}}]').field == "[0].x"
    assert parse_json(b'{"a":"\\ud83d\\ude00","b":' + b"9" * MAX_INT_DIGITS + b"}")["a"] == "😀"
