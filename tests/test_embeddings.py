"""POST /v1/embeddings: the wire (pure) and a real `onepass serve` through the official SDK:
same input same vector, order kept, a paraphrase ranked above an unrelated sentence."""

from __future__ import annotations

import base64
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


@pytest.mark.parametrize(("body", "field", "words"), [
    ({}, "input", "non-empty string"),
    ({"input": []}, "input", "non-empty string"),
    ({"input": ["a", ""]}, "input[1]", "non-empty string"),
    ({"input": ["a"] * 129}, "input", "limit of 128"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float or base64"),
    ({"input": "a", "dimensions": 0}, "dimensions", ">= 1"),
    ({"input": "a", "truncate": True}, "truncate", "unknown field"),
])
def test_bad_embedding_bodies_name_their_field(body, field, words):
    with pytest.raises(ContractError) as err:
        W.parse_embeddings(body)
    assert err.value.field == field and words in err.value.message


def test_vectors_truncate_then_normalise_and_base64_is_little_endian_float32():
    req = W.parse_embeddings({"input": "x", "dimensions": 2, "encoding_format": "base64"})
    assert req.inputs == ["x"] and W.parse_embeddings({"input": [1, 2]}).inputs == [[1, 2]]
    vec = W.embedding_vector([3.0, 4.0, 100.0], 2, "float")
    assert vec == [0.6, 0.8]
    raw = base64.b64decode(W.embedding_vector([3.0, 4.0, 100.0], 2, "base64"))
    assert struct.unpack("<2f", raw) == pytest.approx((0.6, 0.8))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi")
    from server_process import serve

    log_path = tmp_path_factory.mktemp("embeddings") / "server.log"
    with serve(["--threads", "1"], log_path) as url:
        yield url


@pytest.mark.slow
def test_embeddings_through_the_sdk(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server + "/v1", api_key="local", timeout=120,
                           max_retries=0)
    texts = [t for triple in TRIPLES for t in triple]
    out = client.embeddings.create(model="jev-latest", input=texts)
    assert [d.index for d in out.data] == list(range(len(texts)))
    vectors = [d.embedding for d in out.data]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    assert out.usage.prompt_tokens > len(texts)
    again = client.embeddings.create(model="jev-latest", input=texts[3])  # alone: same vector
    assert again.data[0].embedding == pytest.approx(vectors[3], abs=1e-5)
    reversed_ = client.embeddings.create(model="jev-latest", input=texts[::-1])
    assert reversed_.data[-1].embedding == pytest.approx(vectors[0], abs=1e-5)

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b))

    for k in range(len(TRIPLES)):
        anchor, para, other = vectors[3 * k: 3 * k + 3]
        assert cos(anchor, para) - cos(anchor, other) > MIN_MARGIN, TRIPLES[k]
    # the SDK's default is base64 when numpy is present; both decode to the same vector
    short = client.embeddings.create(model="jev-latest", input="hello", dimensions=64,
                                     encoding_format="base64")
    assert len(short.data[0].embedding) == 64 or isinstance(short.data[0].embedding, str)
    with httpx.Client(base_url=server, timeout=60) as http:
        r = http.post("/v1/embeddings", json={"input": "word " * 10000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0]"
        r = http.post("/v1/embeddings", json={"input": "x", "dimensions": 100000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
