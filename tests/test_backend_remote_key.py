"""A remote engine that requires an API key (issue 25, item 10): a real `onepass serve
--api-key` worker on loopback as the engine. The remote backend sends the key as a bearer
token (flag, environment, models-config key), a missing or wrong key is a clear refusal that
names the setting and never shows the key, and the front-end's generation routes are
forwarded to the engine with the key (server/forwarding.py), answered under the front's name."""

from __future__ import annotations

import json

import httpx
import pytest
from server_process import serve

from onepass.backends.remote import EngineError, RemoteBackend
from onepass.engine import DecisionEngine

KEY = "engine-secret-7f3a9c"
FRONT_KEY = "front-secret-1b2c"
REQUEST = {"state": "My parcel arrived broken and two weeks late.",
           "questions": {"angry": {"type": "noul", "instructions": "The customer is upset."}}}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """A onepass worker that accepts only ``Authorization: Bearer KEY``."""
    log = tmp_path_factory.mktemp("engine_key") / "worker.log"
    with serve(["--threads", "1", "--api-key", KEY], log) as url:
        yield url


def test_the_engine_key_is_sent_and_a_missing_or_wrong_one_is_named(engine, worker):
    tokenizer, name = engine.backend.tokenizer, engine.served_name
    for key in (None, "not-the-key"):
        with pytest.raises(EngineError) as info:
            RemoteBackend("onepass", worker, tokenizer, name=name, api_key=key)
        assert info.value.status == 502 and info.value.upstream in (401, 403)
        message = info.value.message
        assert "--engine-api-key" in message and "ONEPASS_ENGINE_API_KEY" in message
        assert KEY not in message and "not-the-key" not in message
    remote = RemoteBackend("onepass", worker, tokenizer, name=name, api_key=KEY)
    assert KEY not in repr(vars(remote))  # only inside the HTTP client's headers
    answer = DecisionEngine(remote).answer(REQUEST)["answers"]["angry"]
    local = engine.answer(REQUEST)["answers"]["angry"]
    assert abs(answer["noul"] - local["noul"]) < 0.05, (answer, local)


def test_a_served_front_end_reads_the_key_from_the_environment(worker, tmp_path):
    log = tmp_path / "front.log"
    auth = {"authorization": f"Bearer {FRONT_KEY}"}
    front_args = ["--threads", "1", "--api-key", FRONT_KEY, "--backend", "remote",
                  "--engine", "onepass", "--engine-url", worker]
    with serve(front_args, log, env={"ONEPASS_ENGINE_API_KEY": KEY}) as front:
        r = httpx.post(front + "/v1/systemone", json=REQUEST, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        name = httpx.get(front + "/v1/models", headers=auth, timeout=10).json()["data"][0]["id"]
        for route, body in (
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 2}),
                ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                ("/v1/responses", {"input": "hi", "max_output_tokens": 16})):
            r = httpx.post(front + route, json=body, headers=auth, timeout=60)
            assert r.status_code == 200, (route, r.status_code, r.text)  # the engine generated
            assert r.json()["model"] == name, (route, r.json())
    assert KEY not in log.read_text()  # never logged, at start-up or per request


def test_the_models_config_key_is_read_and_never_shown(tmp_path):
    from onepass.server.served_models import ModelSpec, load_models_config

    config = tmp_path / "models.json"
    config.write_text(json.dumps([{"model": "smollm2-135m-instruct", "backend": "remote",
                                   "engine": "onepass", "engine_url": "http://127.0.0.1:9",
                                   "engine_api_key": KEY}]))
    (spec,) = load_models_config(config, ModelSpec())
    assert spec.engine_api_key == KEY and KEY not in repr(spec)
