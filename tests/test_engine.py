"""The fast path (shared prefix, packed suffixes, prefix cache, candidate rows only) must read
the same numbers as a naive full forward of each whole prompt, on the real embedded model.

The session ``engine`` is float32 (see conftest); tests/test_engine_dtype.py runs the same tests
in bfloat16. Tolerances are per dtype: float32 reads the naive numbers to 1e-4; in bfloat16
(8-bit mantissa) the packed forward rounds differently from a full forward: measured up to 0.012
on these requests (the bound leaves 2x)."""

import json

import pytest
import torch

from onepass.contract import ContractError

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.025}  # on probabilities

STATE = (
    "Order #7710 arrived with a smashed box and a cracked vase inside. Delivery was 3 days ago "
    "and the customer asks what to do next."
)
MIXED = {
    "model": "jev-latest",
    "state": STATE,
    "questions": {
        "refund": {"type": "noul", "instructions": "The customer is eligible for a refund."},
        "dept": {
            "type": "choice",
            "instructions": "Which department should handle this case?",
            "criteria": {
                "billing": "Double charges and payment errors",
                "logistics": "Damaged, lost, or late shipments",
                "product_support": None,
            },
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this case?",
            "criteria": ["Routine", "Urgent", "Emergency"],
        },
        "approved": {
            "type": "noul",
            "instructions": "The request is approved.",
            "criteria": {"yes": "Approved", "no": "Rejected"},
        },
    },
}


def distribution(answer):
    if answer["type"] == "noul":
        return [answer["noul"]]
    return list(answer["probabilities"].values())


def tolerance(engine) -> float:
    return TOLERANCE[engine.backend.model.dtype]


def assert_same(fast, naive, tol: float = TOLERANCE[torch.float32]):
    assert fast.keys() == naive.keys()
    for name in fast:
        a, b = distribution(fast[name]), distribution(naive[name])
        assert len(a) == len(b)
        assert max(abs(x - y) for x, y in zip(a, b)) < tol, name


def test_mixed_request_matches_naive_full_forward(engine):
    engine.backend.cache.clear()
    fast = engine.answer(MIXED)
    naive = engine.answer(MIXED, naive=True)
    assert_same(fast["answers"], naive["answers"], tolerance(engine))
    assert fast["model"] == engine.served_name


def test_cache_hit_reuses_the_prefix_and_reads_the_same_numbers(engine):
    engine.backend.cache.clear()
    miss = engine.answer(MIXED)
    before = engine.backend.cache_stats().hits
    hit = engine.answer(MIXED)
    assert engine.backend.cache_stats().hits == before + 1
    assert hit["usage"]["cached_tokens"] > miss["usage"]["cached_tokens"]
    assert_same(hit["answers"], miss["answers"], tolerance(engine))
    assert_same(hit["answers"], engine.answer(MIXED, naive=True)["answers"], tolerance(engine))


def test_question_alone_equals_question_among_sixteen(engine):
    """Packed among 15 others, a question reads what a naive full forward of its own whole
    prompt reads (the prompt is the same alone or among others)."""
    probe = {"type": "choice", "instructions": "Which department?",
             "criteria": {"billing": None, "logistics": None, "product_support": None}}
    request = {"state": STATE, "questions": {"probe": probe}}
    naive = engine.answer(request, naive=True)["answers"]
    assert_same(engine.answer(request)["answers"], naive, tolerance(engine))
    crowd = {f"q{i}": {"type": "noul", "instructions": f"Statement number {i} " + "x" * i}
             for i in range(15)}
    crowd["probe"] = probe
    among = engine.answer({"state": STATE, "questions": crowd})
    assert among["usage"]["output_tokens"] == 16
    assert_same({"probe": among["answers"]["probe"]}, naive, tolerance(engine))


def test_response_shape_and_types(engine):
    r = engine.answer(MIXED)
    json.dumps(r, allow_nan=False)  # finite JSON numbers only
    a = r["answers"]
    assert set(a["refund"]) == {"type", "noul"} and 0 <= a["refund"]["noul"] <= 1
    assert a["dept"]["choice"] in MIXED["questions"]["dept"]["criteria"]
    assert list(a["dept"]["probabilities"]) == ["billing", "logistics", "product_support"]
    assert sum(a["dept"]["probabilities"].values()) == pytest.approx(1.0)
    assert a["urgency"]["legend"] == {"0": "Routine", "1": "Urgent", "2": "Emergency"}
    probs = a["urgency"]["probabilities"]
    assert a["urgency"]["score"] == pytest.approx(sum(int(k) * p for k, p in probs.items()))
    assert 0.0 <= a["urgency"]["confidence"] <= 1.0
    usage = r["usage"]
    assert isinstance(usage["input_tokens"], int) and isinstance(usage["output_tokens"], int)
    assert usage["output_tokens"] == 4


def test_json_state_and_temperature(engine):
    req = {"state": {"ticket": 7710, "items": ["vase"], "damaged": True},
           "questions": {"d": {"type": "noul", "instructions": "An item is damaged."}}}
    base = engine.answer(req)["answers"]["d"]["noul"]
    hot = engine.answer({**req, "temperature": 5.0})["answers"]["d"]["noul"]
    assert abs(hot - 0.5) < abs(base - 0.5)  # a higher temperature flattens toward 0.5
    assert_same(engine.answer(req)["answers"], engine.answer(req, naive=True)["answers"],
                tolerance(engine))


def test_trivial_questions_do_not_run_the_model(engine):
    r = engine.answer({"state": "x", "questions": {
        "one": {"type": "choice", "instructions": "?", "criteria": {"only": "it"}},
        "lvl": {"type": "score", "instructions": "?", "criteria": ["flat"]},
    }})
    assert r["answers"]["one"] == {"type": "choice", "choice": "only",
                                   "probabilities": {"only": 1.0}, "confidence": 1.0}
    assert r["answers"]["lvl"]["score"] == 0.0 and r["answers"]["lvl"]["confidence"] == 1.0
    assert r["usage"] == {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}


def test_large_choice_beyond_26_options_matches_naive(engine):
    criteria = {f"intent_{i}": f"description {i}" for i in range(40)}
    req = {"state": "I lost my card", "questions": {"c": {
        "type": "choice", "instructions": "Which intent?", "criteria": criteria}}}
    fast = engine.answer(req)["answers"]["c"]
    assert len(fast["probabilities"]) == 40
    assert_same({"c": fast}, engine.answer(req, naive=True)["answers"], tolerance(engine))


def test_unknown_model_and_token_limit_are_client_errors(engine):
    with pytest.raises(ContractError) as info:
        engine.answer({**MIXED, "model": "gpt-4"})
    assert info.value.kind == "model_not_found" and info.value.field == "model"
    limit = engine.max_input_tokens
    engine.max_input_tokens = 50
    try:
        with pytest.raises(ContractError) as info:
            engine.answer(MIXED)
        assert info.value.kind == "max_tokens_exceeded" and "over the limit of 50" in str(
            info.value)
    finally:
        engine.max_input_tokens = limit


def _count_encodes(engine, monkeypatch) -> dict:
    seen = {"calls": 0, "chars": 0}
    encode = engine.backend.encode

    def counting(text, *args, **kwargs):
        seen["calls"] += 1
        seen["chars"] += len(text)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(engine.backend, "encode", counting)
    return seen


@pytest.mark.parametrize("shape", ["long state, 64 questions", "255 long options"])
def test_an_over_limit_prompt_is_refused_after_work_proportional_to_it(engine, monkeypatch,
                                                                        shape):
    """Before the check came first, the refusal cost a tokenization of the whole prompt per
    question (65 here) or of the question per label (256 here): 13 MB / 45 MB of text."""
    if shape.startswith("long state"):
        questions = {f"q{i}": {"type": "noul", "instructions": f"Statement {i}."}
                     for i in range(64)}
        request = {"state": "word " * 40_000, "questions": questions}
    else:
        options = {f"o{i}": "detail " * 100 for i in range(255)}
        request = {"state": "x", "questions": {"c": {
            "type": "choice", "instructions": "Which?", "criteria": options}}}
    seen = _count_encodes(engine, monkeypatch)
    with pytest.raises(ContractError) as info:
        engine.answer(request)
    assert info.value.kind == "max_tokens_exceeded" and info.value.field == "state"
    # each part once, then the longest prompt whole once for the exact count
    assert seen["chars"] < 3 * len(json.dumps(request))


def test_the_length_check_refuses_exactly_past_the_limit(engine, monkeypatch):
    from onepass import prompt as P
    from onepass.contract import parse_request

    live = [q for q in parse_request(MIXED).questions if not q.is_trivial]
    prefix_text = P.render_prefix(engine.format, STATE, engine.context, engine.specials)
    prefix, suffixes = engine.tokenize(
        prefix_text, [engine.question_position(q).suffix for q in live])
    longest = len(prefix) + max(len(s) for s in suffixes)
    monkeypatch.setattr(engine, "max_input_tokens", longest)
    assert engine.answer(MIXED)["usage"]["output_tokens"] == 4
    monkeypatch.setattr(engine, "max_input_tokens", longest - 1)
    with pytest.raises(ContractError) as info:
        engine.answer(MIXED)
    assert f"the prompt has {longest} tokens, over the limit of {longest - 1}" in str(info.value)


def test_typed_helpers(engine):
    p = engine.noul("The sky is blue today.", "The text mentions a colour.")
    assert 0.0 <= p <= 1.0
    c = engine.choice("Bonjour tout le monde", "Which language?", ["english", "french"])
    assert c.choice in ("english", "french") and set(c.probabilities) == {"english", "french"}
    s = engine.score("A whale", "How big?", ["small", "medium", "large"])
    assert 0.0 <= s.score <= 2.0 and set(s.legend) == {"0", "1", "2"}


def test_cached_prefix_is_never_mutated_by_requests(engine):
    engine.backend.cache.clear()
    engine.answer(MIXED)
    entries = list(engine.backend.cache._items.items())
    assert entries
    snapshot = [[(k.clone(), v.clone()) for k, v in kv] for _, kv in entries]
    engine.answer(MIXED)  # a hit: suffixes run on top of the cached tensors
    engine.answer({**MIXED, "questions": {"x": {"type": "noul", "instructions": "Other."}}})
    for (_, kv), before in zip(entries, snapshot):
        for (k, v), (k0, v0) in zip(kv, before):
            assert k.equal(k0) and v.equal(v0)


def test_concurrent_requests_from_threads_give_the_same_answers(engine):
    from concurrent.futures import ThreadPoolExecutor

    states = [STATE, "A different ticket about a double charge.", STATE]
    requests = [{**MIXED, "state": s} for s in states]
    serial = [engine.answer(r)["answers"] for r in requests]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda r: engine.answer(r)["answers"], requests * 2))
    for got, want in zip(parallel, serial * 2):
        assert_same(got, want, tolerance(engine))


def test_packing_groups_bound_each_forward():
    from onepass.backends.torch import packing_groups

    assert packing_groups([10, 10, 10], 100) == [[0, 1, 2]]
    assert packing_groups([60, 50, 40, 10], 100) == [[0], [1, 2, 3]]
    assert packing_groups([150, 10], 100) == [[0], [1]]


def test_split_packing_reads_the_same_numbers(engine):
    budget = engine.backend.max_packed_tokens
    try:
        engine.backend.max_packed_tokens = 64  # forces several forwards for this request
        split = engine.answer(MIXED)
    finally:
        engine.backend.max_packed_tokens = budget
    assert_same(split["answers"], engine.answer(MIXED)["answers"], tolerance(engine))


@pytest.mark.parametrize("budget,pairs", [(4096, 1 << 40), (64, 1 << 40), (4096, 0)])
def test_a_miss_prefills_inside_the_packed_forward_and_caches_the_prefix(engine, budget, pairs):
    """On a miss the uncached prefix rides in the first packed forward, or gets its own
    forward when prefix + suffixes exceed the packing budget (64) or the merge would waste too
    much attention (pairs 0); all read the naive numbers and leave the prefix in the cache."""
    request = {**MIXED, "state": f"{MIXED['state']} (a state no other test uses: {budget} "
                                 f"{pairs})"}
    backend = engine.backend
    saved = backend.max_packed_tokens, backend.merge_pairs
    try:
        backend.max_packed_tokens, backend.merge_pairs = budget, pairs
        before = engine.backend.cache_stats()
        miss = engine.answer(request)
        after = engine.backend.cache_stats()
        hit = engine.answer(request)
    finally:
        backend.max_packed_tokens, backend.merge_pairs = saved
    assert after.misses + after.partial_hits == before.misses + before.partial_hits + 1
    assert miss["usage"]["cached_tokens"] < hit["usage"]["cached_tokens"]
    assert_same(miss["answers"], engine.answer(request, naive=True)["answers"], tolerance(engine))
    assert_same(hit["answers"], miss["answers"], tolerance(engine))


def test_a_large_request_attends_per_suffix_and_reads_the_naive_numbers(engine, monkeypatch):
    """Eight questions longer together than their state take the per-suffix attention (no
    dense mask that would score each suffix against the others' keys) and still read each
    prompt's naive full-forward numbers."""
    backend = engine.backend
    # the packed forward, whatever an earlier in-process server test left on the session
    # engine (shared steps: the next test covers those)
    monkeypatch.setattr(engine, "scorer", None)
    taken = []
    plan = backend._suffix_segments
    monkeypatch.setattr(backend, "_suffix_segments",
                        lambda *a: taken.append(plan(*a)) or taken[-1])
    state = " ".join(f"Ticket {i}: order {4000 + i} arrived late and damaged." for i in range(15))
    crowd = {f"q{i}": {"type": "choice", "instructions": f"Which team handles ticket {i}?",
                       "criteria": {"billing": "payments", "logistics": "shipping",
                                    "support": "product help"}} for i in range(8)}
    request = {"state": state, "questions": crowd}
    backend.cache.clear()
    fast = engine.answer(request)
    assert taken and all(s is not None for s in taken)
    assert_same(fast["answers"], engine.answer(request, naive=True)["answers"], tolerance(engine))


def test_decisions_in_shared_steps_attend_per_suffix_and_read_the_naive_numbers(engine,
                                                                                monkeypatch):
    """Scored inside the scheduler's steps (as the server does), each suffix row attends to its
    prefix's arena rows and its own only, and reads the naive numbers."""
    backend = engine.backend
    monkeypatch.setattr(engine, "scorer", engine.generator.scheduler.score)
    taken = []
    plan = backend._segments
    monkeypatch.setattr(backend, "_segments", lambda *a: taken.append(plan(*a)) or taken[-1])
    # many questions over a short state: a dense mask would spend most of its work on suffix
    # pairs (the arena holds only the rows in use, so a few questions would stay dense)
    state = " ".join(f"Ticket {i}: order {5000 + i} was charged twice." for i in range(8))
    crowd = {f"q{i}": {"type": "score", "instructions": f"How urgent is ticket {i}?",
                       "criteria": ["routine", "soon", "today", "now"]} for i in range(24)}
    request = {"state": state, "questions": crowd}
    backend.cache.clear()
    fast = engine.answer(request)
    segmented = [s for s in taken if s is not None]
    assert sum(len(s.items) for s in segmented) >= len(crowd)  # the prefix, a row per suffix
    monkeypatch.setattr(engine, "scorer", None)
    assert_same(fast["answers"], engine.answer(request, naive=True)["answers"], tolerance(engine))


def test_engine_config_holds_every_from_pretrained_option_and_passes_each_through(monkeypatch):
    """One value for the loading options: a keyword added to from_pretrained without a field
    here (or the reverse) fails, and from_config hands every field over unchanged."""
    import dataclasses
    import inspect

    from onepass.engine import DecisionEngine, EngineConfig

    keywords = set(inspect.signature(DecisionEngine.from_pretrained).parameters) - {"model"}
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    assert keywords == names
    seen = {}
    monkeypatch.setattr(DecisionEngine, "from_pretrained",
                        classmethod(lambda cls, model, **kw: seen.update(model=model, **kw)))
    config = EngineConfig(device="cpu", max_input_tokens=99, backend="remote", engine="vllm",
                          engine_url="http://127.0.0.1:1", engine_api_key="secret", n_ctx=512)
    DecisionEngine.from_config("m", config)
    assert seen == {"model": "m", **{n: getattr(config, n) for n in names}}
    assert "secret" not in repr(config)
