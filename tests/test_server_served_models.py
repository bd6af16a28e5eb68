"""Several resident models in one `onepass serve`: configuration checks (pure) and two real
models, each answering its own name on every route."""

from __future__ import annotations

import json

import httpx
import pytest

from onepass.server.served_models import (
    ModelsConfigError,
    ModelSpec,
    load_models_config,
    specs_from_flags,
)

pytest.importorskip("fastapi")

BASE = ModelSpec()


def write(tmp_path, content) -> str:
    path = tmp_path / "models.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_config_entries_override_the_shared_flags(tmp_path):
    specs = load_models_config(write(tmp_path, [
        {"model": "a"}, {"model": "b", "served_model": "bee", "max_concurrency": 2,
                         "default_max_output_tokens": 64, "dtype": "float32"},
    ]), ModelSpec(max_input_tokens=4096))
    assert [s.model for s in specs] == ["a", "b"]
    assert specs[1].served_model == "bee" and specs[1].max_concurrency == 2
    assert specs[0].max_input_tokens == specs[1].max_input_tokens == 4096


@pytest.mark.parametrize("content, message", [
    ("[", "not JSON"),
    ("[]", "non-empty JSON array"),
    ('{"model": "a"}', "non-empty JSON array"),
    ('["a"]', "[0]: expected an object"),
    ('[{"served_model": "x"}]', "[0].model"),
    ('[{"model": "a", "threads": 2}]', "unknown key 'threads'"),
    ('[{"model": "a", "dtype": "fp64"}]', "[0].dtype: expected one of"),
    ('[{"model": "a", "max_concurrency": 0}]', "[0].max_concurrency"),
    ('[{"model": "a", "max_concurrency": true}]', "[0].max_concurrency"),
    ('[{"model": "a"}, {"model": "b", "served_model": "a"}]', "both served as 'a'"),
    ('[{"model": "a", "task": "embed"}]', "[0].task: expected one of generate, embedding"),
    ('[{"model": "a"}, {"model": "b", "task": "embedding", "adapter": "x"}]',
     "[1].adapter: an embedding model"),
    ('[{"model": "a", "task": "embedding", "dtype": "bfloat16"}]',
     "[0].dtype: an embedding model"),
    ('[{"model": "a", "task": "embedding", "backend": "llamacpp"}]',
     "[0].backend: an embedding model"),
    ('[{"model": "a", "backend": "vllm"}]', "[0].backend: expected one of torch, llamacpp"),
    ('[{"model": "a", "backend": "remote", "engine_url": "http://x"}]',
     "[0].engine: backend remote needs"),
    ('[{"model": "a", "backend": "remote", "engine": "tgi", "engine_url": "http://x"}]',
     "[0].engine: backend remote needs"),
    ('[{"model": "a", "backend": "remote", "engine": "vllm"}]', "[0].engine_url"),
    # a remote engine serves its own weights: the adapter would be recorded, never applied
    ('[{"model": "a", "backend": "remote", "engine": "vllm", "engine_url": "http://x", '
     '"adapter": "out/lora"}]', "[0].adapter: backend remote"),
])
def test_bad_configs_name_the_entry_and_key(tmp_path, content, message):
    with pytest.raises(ModelsConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_models_config(write(tmp_path, content), BASE)


def test_each_entry_chooses_its_backend(tmp_path):
    specs = load_models_config(write(tmp_path, [
        {"model": "smollm2-135m-instruct", "backend": "llamacpp"},
        {"model": "Qwen/Qwen2.5-0.5B-Instruct", "served_model": "big", "backend": "remote",
         "engine": "vllm", "engine_url": "http://10.0.0.5:8000"},
        {"model": "gemma3-270m"},
    ]), BASE)
    assert [(s.backend, s.engine, s.engine_url) for s in specs] == [
        ("llamacpp", None, None), ("remote", "vllm", "http://10.0.0.5:8000"),
        ("torch", None, None)]


def test_task_embedding_from_the_config_and_the_flags(tmp_path):
    specs = load_models_config(write(tmp_path, [
        {"model": "smollm2-135m-instruct"},
        {"model": "all-minilm-l6-v2", "served_model": "minilm", "task": "embedding"},
    ]), BASE)
    assert [s.task for s in specs] == ["generate", "embedding"]
    assert specs_from_flags(["m"], None, ModelSpec(task="embedding"))[0].task == "embedding"
    with pytest.raises(ModelsConfigError, match="task embedding needs the model to load"):
        specs_from_flags(None, None, ModelSpec(task="embedding"))


def test_flags_pair_models_with_served_names():
    specs = specs_from_flags(["a", "b"], ["x"], BASE)
    assert [(s.model, s.served_model) for s in specs] == [("a", "x"), ("b", None)]
    with pytest.raises(ModelsConfigError, match="at most one --served-model per --model"):
        specs_from_flags(["a"], ["x", "y"], BASE)
    with pytest.raises(ModelsConfigError, match="both served as 'a'"):
        specs_from_flags(["a", "a"], None, BASE)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    from server_process import serve

    log = tmp_path_factory.mktemp("models") / "server.log"
    args = ["--threads", "1", "--model", "smollm2-135m-instruct", "--served-model", "small",
            "--model", "gemma3-270m", "--served-model", "gemma"]
    with serve(args, log) as url:
        yield url


def test_two_resident_models_each_answer_their_own_name_on_every_route(two_models):
    url = two_models
    names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
    assert names[:2] == ["small", "gemma"] and "jev-latest" in names
    question = {"state": "I was charged twice for one order.",
                "questions": {"refund": {"type": "noul",
                                         "instructions": "The customer wants money back."}}}
    answers = {}
    for name in ("small", "gemma", "jev-latest"):
        r = httpx.post(url + "/v1/systemone", json={**question, "model": name}, timeout=60)
        assert r.status_code == 200, r.text
        answers[name] = r.json()
    assert answers["small"]["model"] == "small" and answers["gemma"]["model"] == "gemma"
    assert answers["jev-latest"]["model"] == "small"  # the default model
    assert answers["small"]["answers"] != answers["gemma"]["answers"]  # two different models
    schema = {"type": "object", "properties": {"urgent": {"type": "boolean"}}}
    for name in ("small", "gemma"):
        r = httpx.post(url + "/v1/decisions/schema", timeout=60, json={
            "model": name, "context": "Server is down!", "schema": schema,
                "mode": "batch"})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == name
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": name, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi."}]})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == name and r.json()["usage"]["completion_tokens"] >= 1
    for route, body in (("/v1/systemone", question),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                        ("/v1/decisions/schema",
                         {"context": "x", "schema": schema, "mode": "batch"})):
        r = httpx.post(url + route, json={**body, "model": "nope"}, timeout=30)
        assert r.status_code == 404, (route, r.text)
        assert "nope" in r.json()["error"]["message"]
