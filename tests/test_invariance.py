"""Same input, same answer, at the default compute (what ``--dtype auto`` picks on the CPU the
suite runs on: bfloat16 where it has bfloat16 units, float32 elsewhere): decisions and greedy
text do not depend on cache state, batch company, streaming or the process that computes them.

Every comparison here is exact (``==`` on probabilities, tokens and text): the batch-invariant
attention (backends/packed_attention.py) gives each query a kernel call whose shape is fixed by
its position, and the decoder's linears are row-invariant (backends/rows.py, measured below), so
the same prompt computes the same bits in every forward it meets. The other float dtype gets the
same exact checks on one request; the int8 and quantized working weights are checked at the end.
Tolerances between paths of different arithmetic are in tests/test_engine.py.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
import torch
from server_process import serve
from test_engine import MIXED, STATE

from onepass.engine import DecisionEngine
from onepass.generate.runner import collect
from onepass.generate.sampling import SamplingParams

PROBE = {"type": "choice", "instructions": "Which department should handle this case?",
         "criteria": {"billing": "Double charges and payment errors",
                      "logistics": "Damaged, lost, or late shipments",
                      "product_support": None}}
CROWD = {f"q{i}": {"type": "noul", "instructions": f"Statement number {i} " + "x" * i}
         for i in range(15)}
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, logprobs=0)
TOKENS = 128  # before the batch-invariant kernels a cache miss and a hit parted at token 111


def probabilities(response: dict) -> dict:
    """Every answer's distribution, by question name (floats compared exactly)."""
    out = {}
    for name, a in response["answers"].items():
        out[name] = a["noul"] if a["type"] == "noul" else dict(a["probabilities"])
    return out


@pytest.fixture(scope="module")
def engine(auto_dtype):
    """The embedded model at the compute ``--dtype auto`` gives a user of this CPU (the suite's
    session engine is float32 everywhere: see conftest). A CPU without bfloat16 units runs
    bfloat16 emulated, ~2.5x slower than float32: what it does not default to, it checks on
    one request (below) rather than on every proof here."""
    return DecisionEngine.from_pretrained(device="cpu", dtype=auto_dtype)


def test_the_decoder_linears_are_row_invariant(engine):
    """The premise: a token's row through every linear is the same bits whatever else the
    matrix holds (1 to 700 rows, through the scheme rows.py chose for this dtype)."""
    torch.manual_seed(0)
    x = torch.randn(700, engine.backend.config.hidden_size).to(engine.backend.model.dtype)
    layer = engine.backend.decoder.layers[0]
    with torch.inference_mode():
        for linear in (layer.self_attn.q_proj, layer.mlp.gate_proj, engine.backend.lm_head):
            whole = linear(x)
            for rows in (1, 3, 17, 256):
                assert torch.equal(linear(x[-rows:]), whole[-rows:]), (linear, rows)


def test_a_cache_hit_a_miss_and_the_naive_forward_read_the_same_bits(engine):
    engine.backend.cache.clear()
    miss = probabilities(engine.answer(MIXED))
    hit = engine.answer(MIXED)
    assert hit["usage"]["cached_tokens"] > 0
    assert probabilities(hit) == miss
    assert probabilities(engine.answer(MIXED, naive=True)) == miss


def test_a_question_alone_among_sixteen_and_split_across_forwards_reads_the_same_bits(engine):
    engine.backend.cache.clear()
    alone = probabilities(engine.answer({"state": STATE, "questions": {"probe": PROBE}}))
    engine.backend.cache.clear()
    among = probabilities(engine.answer({"state": STATE, "questions": {**CROWD, "probe": PROBE}}))
    assert among["probe"] == alone["probe"]
    saved = engine.backend.max_packed_tokens
    engine.backend.max_packed_tokens = 64  # every suffix in its own forward
    try:
        engine.backend.cache.clear()
        split = probabilities(engine.answer({"state": STATE,
                                             "questions": {**CROWD, "probe": PROBE}}))
    finally:
        engine.backend.max_packed_tokens = saved
    assert split == among


def test_decisions_in_the_servers_shared_steps_read_the_packed_forwards_bits(engine,
                                                                           monkeypatch):
    """The server scores inside the scheduler's steps (paged arena, other work packed beside):
    the same bits as the library's packed forward."""
    request = {"state": STATE, "questions": {**CROWD, "probe": PROBE}}
    engine.backend.cache.clear()
    packed = probabilities(engine.answer(request))
    monkeypatch.setattr(engine, "scorer", engine.generator.scheduler.score)
    engine.backend.cache.clear()
    assert probabilities(engine.answer(request)) == packed
    assert probabilities(engine.answer(request)) == packed  # and from the cache


def test_rotations_give_one_answer_under_every_order_of_five_options(engine):
    """``--debias rotations`` reads every cyclic rotation of the options in name order, so any
    declared order reads the same prompts; here they also read the same bits wherever they
    are packed: every third of the 120 orders of a 5-option choice as 40 questions of one
    request (200 suffixes over several forwards, on a miss; all 120 took 7 minutes at this
    CPU's emulated bfloat16 and proved nothing more), then one order alone on a hit."""
    names = ["billing", "logistics", "returns", "support", "fraud"]
    orders = {f"o{i}": {"type": "choice", "instructions": "Which team?",
                        "criteria": {name: None for name in order}}
              for i, order in enumerate(itertools.permutations(names)) if i % 3 == 0}
    engine.backend.cache.clear()
    together = engine.answer({"state": STATE, "questions": orders, "debias": "rotations"})
    alone = engine.answer({"state": STATE, "questions": {"o21": orders["o21"]},
                           "debias": "rotations"})
    seen = {(a["choice"], tuple(sorted(a["probabilities"].items())))
            for a in (*together["answers"].values(), alone["answers"]["o21"])}
    assert len(together["answers"]) == 40 and len(seen) == 1, seen


def test_greedy_text_is_the_same_alone_on_a_miss_and_on_a_hit_beside_other_streams(engine):
    generator = engine.generator
    prompt = generator.chat_prompt([{"role": "user",
                                     "content": "Write a long essay about rivers."}])
    engine.backend.cache.clear()
    (miss,) = generator.run(prompt, GREEDY, TOKENS)  # alone, its prompt never seen
    others = [generator.chat_prompt([{"role": "user", "content": text}])
              for text in ("Tell me a story about a lighthouse.", "Explain how bread rises.")]
    company = [s for p in others for s in generator.start(p, GREEDY, TOKENS)]
    (beside,) = generator.start(prompt, GREEDY, TOKENS)  # from the cache, among two others
    results = [collect(s) for s in (*company, beside)]
    assert results[-1].cached_tokens > 0
    tokens = [t.id for t in miss.tokens]
    assert len(tokens) == TOKENS
    assert [t.id for t in results[-1].tokens] == tokens


def test_the_other_float_dtype_reads_the_same_bits_too(auto_dtype):
    """The float dtype ``auto`` does not pick here, by ``--dtype``: float32 (MKL's linears in
    8-row blocks of one batched matmul, its 1-3-row kernels round differently) or bfloat16
    (oneDNN's kernels, a call per block); the same attention."""
    other = DecisionEngine.from_pretrained(
        device="cpu", dtype="float32" if auto_dtype == "bfloat16" else "bfloat16")
    other.backend.cache.clear()
    alone = probabilities(other.answer({"state": STATE, "questions": {"probe": PROBE}}))
    other.backend.cache.clear()
    among = probabilities(other.answer({"state": STATE, "questions": {**CROWD, "probe": PROBE}}))
    assert among["probe"] == alone["probe"]
    assert probabilities(other.answer(MIXED)) == probabilities(other.answer(MIXED, naive=True))


@pytest.mark.parametrize("compute", ["int8", "fp8-artifact"])
def test_int8_and_quantized_weights_keep_the_invariance(compute, tmp_path_factory):
    """``--compute int8`` (per-token int8 activations: integer dot products, exact) and a
    quantized artifact (fp8 weights decoded per forward into bfloat16): the same bits alone,
    among sixteen and from the cache."""
    if compute == "int8":
        from onepass.quant.artifact import QuantizeError, cpu_has_int8_dot

        if not cpu_has_int8_dot():  # machines of this kind differ: this one cannot run it
            with pytest.raises(QuantizeError, match="VNNI"):
                DecisionEngine.from_pretrained(device="cpu", dtype="bfloat16", compute="int8")
            pytest.skip("this CPU has no int8 dot-product units (VNNI/AMX-INT8): --compute int8 "
                        "is refused here, as checked")
        quantized = DecisionEngine.from_pretrained(device="cpu", dtype="bfloat16",
                                                   compute="int8")
    else:
        from onepass.commands.quantize import quantize

        path = tmp_path_factory.mktemp("fp8") / "model"
        quantize(None, None, "fp8", path, compute="stored")
        quantized = DecisionEngine.from_pretrained(str(path), device="cpu", dtype="bfloat16")
    quantized.backend.cache.clear()
    alone = probabilities(quantized.answer({"state": STATE, "questions": {"probe": PROBE}}))
    among = probabilities(quantized.answer({"state": STATE,
                                            "questions": {**CROWD, "probe": PROBE}}))
    assert among["probe"] == alone["probe"]
    quantized.backend.cache.clear()
    assert probabilities(quantized.answer(MIXED)) == probabilities(quantized.answer(MIXED))


# ---------------------------------------------------------------- served


@pytest.fixture(scope="module")
def worker(tmp_path_factory, auto_dtype):
    log = tmp_path_factory.mktemp("invariance") / "worker.log"
    with serve(["--threads", "1", "--dtype", auto_dtype], log) as url:
        yield url


def chat_body(stream: bool, tokens: int = TOKENS) -> dict:
    """A greedy chat request of exactly ``tokens`` tokens (end-of-sequence ignored)."""
    return {"model": "jev-latest", "temperature": 0, "max_tokens": tokens, "ignore_eos": True,
            "stream": stream,
            "messages": [{"role": "user", "content": "Describe the water cycle, step by step."}]}


def chat(url: str, stream: bool) -> str:
    body = chat_body(stream)
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == TOKENS
        return r.json()["choices"][0]["message"]["content"]
    text = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    text.append(chunk["choices"][0]["delta"].get("content") or "")
    return "".join(text)


def test_served_greedy_text_is_the_same_streamed_or_not_on_a_miss_or_a_hit(worker):
    first = chat(worker, stream=False)  # a miss: the chat prompt was never seen
    assert chat(worker, stream=True) == first  # a hit, streamed


def test_a_served_decision_reads_the_same_bits_alone_among_sixteen_and_beside_a_stream(worker):
    def ask(questions):
        r = httpx.post(worker + "/v1/systemone", timeout=120,
                       json={"model": "jev-latest", "state": STATE, "questions": questions})
        assert r.status_code == 200, r.text
        return probabilities(r.json())

    alone = ask({"probe": PROBE})
    assert ask({**CROWD, "probe": PROBE})["probe"] == alone["probe"]
    beside: dict = {}
    with httpx.stream("POST", worker + "/v1/chat/completions",
                      json=chat_body(True, 4 * TOKENS), timeout=600) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # it is decoding now
        for i in range(3):  # its decode rows share the decision's steps
            beside[i] = ask({**CROWD, "probe": PROBE})["probe"]
        # 512 tokens at one thread outlast the three asks many times over; closing the
        # stream cancels what is left of it (the decisions are what this test reads)
        assert next(line for line in lines if line.startswith("data: {"))
    assert all(b == alone["probe"] for b in beside.values()), beside


def test_a_remote_front_end_reads_its_workers_bits(worker, tmp_path):
    direct = httpx.post(worker + "/v1/systemone", json=MIXED, timeout=120)
    assert direct.status_code == 200, direct.text
    with serve(["--threads", "1", "--backend", "remote", "--engine", "onepass",
                "--engine-url", worker], tmp_path / "front.log") as front:
        proxied = httpx.post(front + "/v1/systemone", json=MIXED, timeout=120)
    assert proxied.status_code == 200, proxied.text
    assert probabilities(proxied.json()) == probabilities(direct.json())
