"""The sampler: each stage on crafted logits, the composed pipeline, seeds, and validation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from onepass.contract import ContractError
from onepass.generate.sampling import (
    Draw,
    SamplingParams,
    TokenHistory,
    apply_logit_bias,
    apply_mask,
    apply_penalties,
    apply_temperature,
    check_vocab,
    draw,
    make_generator,
    min_p_filter,
    sample,
    top_k_filter,
    top_p_filter,
    typical_filter,
)

PROBS = [0.5, 0.3, 0.15, 0.05]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()


def kept(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def draws(params: SamplingParams, logits: torch.Tensor, n: int, seed: int = 0) -> list[int]:
    gen = make_generator(seed)
    return [sample(logits, params, generator=gen).token for _ in range(n)]


# --------------------------------------------------------------------------- stages


def test_logit_bias_adds_and_leaves_the_input_alone():
    x = torch.tensor([1.0, 2.0, 3.0])
    y = apply_logit_bias(x, ((0, 5.0), (2, -1.5)))
    assert y.tolist() == [6.0, 2.0, 1.5]
    assert x.tolist() == [1.0, 2.0, 3.0]
    assert apply_logit_bias(x, ()) is x


def test_penalties_exact_arithmetic():
    x = torch.tensor([2.0, -2.0, 1.0, 0.5, 3.0])
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    # repetition over prompt + output (0, 1, 2; duplicates count once); presence/frequency over
    # the output only: token 2 generated 3 times, token 3 never generated nor in the context
    y = apply_penalties(x, p, {2: 3}, [0, 1, 2, 0, 2])
    assert y.tolist() == pytest.approx([1.0, -4.0, 0.5 - 0.75 - 0.5, 0.5, 3.0])
    assert x.tolist() == [2.0, -2.0, 1.0, 0.5, 3.0]


def test_penalties_off_or_empty_history_change_nothing():
    x = torch.tensor([2.0, -2.0, 1.0])
    assert apply_penalties(x, SamplingParams(), {1: 4}, [0, 1]) is x
    p = SamplingParams(repetition_penalty=1.5, presence_penalty=1.0)
    assert apply_penalties(x, p, {}, []) is x


def test_negative_presence_and_frequency_encourage_repeats():
    x = torch.zeros(3)
    p = SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)
    assert apply_penalties(x, p, {1: 2}, [1]).tolist() == [0.0, 2.0, 0.0]


def test_temperature_divides_the_row_shifted_to_max_zero():
    x = torch.tensor([1.0, -2.0, 4.0])
    assert apply_temperature(x, 0.5).tolist() == [-6.0, -12.0, 0.0]
    assert apply_temperature(x, 1.0) is x
    tiny = apply_temperature(torch.tensor([30.0, 29.9, -50.0]), 1e-6)
    assert tiny[0] == 0 and torch.isfinite(tiny[:2]).all()  # no overflow, no NaN
    sharp = SamplingParams(temperature=1e-6, min_p=0.5)
    assert set(draws(sharp, torch.tensor([30.0, 30.0, 29.9]), 200)) == {0, 1}


def test_top_k_keeps_exactly_the_k_largest():
    x = torch.tensor([0.1, 3.0, -1.0, 2.5, 2.0, float("-inf")])
    values, ids = top_k_filter(x, 2)
    assert ids.tolist() == [1, 3] and values.tolist() == [3.0, 2.5]
    assert top_k_filter(x, 0) == (x, None)
    assert top_k_filter(x, 6) == (x, None)


@pytest.mark.parametrize(
    "top_p, expected",
    [(0.01, {0}), (0.5, {0}), (0.79, {0, 1}), (0.81, {0, 1, 2}), (0.99, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    # shuffled so that the kept set is not simply a prefix of the row
    order = [2, 0, 3, 1]
    x = logits_of([PROBS[i] for i in order])
    row = top_p_filter(x, top_p)
    assert {order[i] for i in kept(row)} == expected
    assert torch.equal(row[list(kept(row))], x[list(kept(row))])  # survivors unchanged


def test_top_p_wide_nucleus_matches_a_full_sort():
    # a flat 5000-token row: the nucleus needs more than the first 256-wide window
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 0.3
    for top_p in (0.3, 0.9, 0.999):
        probs = torch.softmax(x, -1)
        sorted_probs, order = torch.sort(probs, descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        expected = set(order[before < top_p].tolist())
        assert len(expected) > 256
        assert kept(top_p_filter(x, top_p)) == expected
    assert top_p_filter(x, 1.0) is x


@pytest.mark.parametrize(
    "min_p, expected", [(0.3, {0, 1, 2}), (0.31, {0, 1}), (0.1, {0, 1, 2, 3}), (1.0, {0})]
)
def test_min_p_keeps_tokens_within_a_fraction_of_the_top(min_p, expected):
    # p >= min_p x 0.5: 0.3 keeps >= 0.15; 0.31 keeps >= 0.155
    assert kept(min_p_filter(logits_of(PROBS), min_p)) == expected


def test_min_p_off_is_identity():
    x = logits_of(PROBS)
    assert min_p_filter(x, 0.0) is x


def test_typical_prefers_tokens_near_the_entropy_over_the_argmax():
    # entropy 1.33 nats; surprisal of 0.4 is 0.92 (distance 0.42), of 0.2 is 1.61 (0.28):
    # the three 0.2 tokens are more typical, and they reach 0.5 before the argmax is needed
    x = logits_of([0.4, 0.2, 0.2, 0.2])
    assert kept(typical_filter(x, 0.5)) == {1, 2, 3}
    assert kept(typical_filter(x, 0.7)) == {0, 1, 2, 3}
    only = kept(typical_filter(x, 1e-6))  # never empty: the single most typical token
    assert len(only) == 1 and only < {1, 2, 3}
    assert typical_filter(x, 1.0) is x


def test_typical_matches_the_transformers_formula():
    gen = torch.Generator().manual_seed(3)
    for n, mass in ((50, 0.5), (3000, 0.9), (3000, 0.2)):
        x = torch.randn(n, generator=gen) * 2
        logp = torch.log_softmax(x, -1)
        shifted = (-logp - (-(logp.exp() * logp).sum())).abs()
        distance, order = torch.sort(shifted)
        probs = logp.exp()[order]
        before = probs.cumsum(0) - probs
        assert kept(typical_filter(x, mass)) == set(order[before < mass].tolist())


def test_typical_ignores_tokens_already_removed():
    x = logits_of([0.4, 0.2, 0.2, 0.2])
    x[3] = float("-inf")
    row = typical_filter(x, 0.9)
    assert 3 not in kept(row) and kept(row)


def test_draw_never_picks_a_removed_token():
    x = torch.tensor([float("-inf"), 0.0, float("-inf"), 0.0, float("-inf")])
    gen = make_generator(0)
    assert {draw(x, gen) for _ in range(300)} == {1, 3}


# --------------------------------------------------------------------------- composition


def test_temperature_zero_is_argmax_after_bias_and_penalties():
    x = torch.tensor([1.0, 3.0, 2.0, 0.5])
    greedy = SamplingParams(temperature=0, top_k=1, typical_p=0.01)
    assert sample(x, greedy).token == 1
    biased = SamplingParams(temperature=0, logit_bias={"3": 2.6})
    assert sample(x, biased).token == 3
    penalised = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(x, penalised, context_ids=[1]).token == 2
    gen = make_generator(5)
    state = gen.get_state()
    assert {sample(x, greedy, generator=gen).token for _ in range(20)} == {1}
    assert torch.equal(gen.get_state(), state)  # greedy consumes no randomness


def test_logit_bias_minus_100_bans_and_plus_100_forces():
    x = torch.tensor([10.0, 9.0, 1.0, 0.0])
    banned = SamplingParams(logit_bias={"0": -100})
    assert 0 not in draws(banned, x, 2000)
    assert sample(x, SamplingParams(temperature=0, logit_bias={"0": -100})).token == 1
    assert set(draws(SamplingParams(logit_bias={"3": 100}), x, 500)) == {3}


def test_mask_stage_removes_disallowed_tokens_and_none_is_identity():
    x = torch.tensor([1.0, 3.0, 2.0, 0.5])
    mask = torch.tensor([True, False, True, False])
    out = apply_mask(x, mask)
    assert kept(out) == {0, 2} and out[0] == 1.0 and out[2] == 2.0
    assert torch.equal(x, torch.tensor([1.0, 3.0, 2.0, 0.5]))  # the input is not written
    assert apply_mask(x, None) is x


def test_mask_comes_after_bias_so_plus_100_cannot_force_a_forbidden_token():
    x = torch.tensor([10.0, 9.0, 1.0, 0.0, 5.0])
    mask = torch.tensor([False, True, True, False, False])
    forced = {"3": 100, "0": 100}
    assert sample(x, SamplingParams(temperature=0, logit_bias=forced), mask=mask).token == 1
    hot = SamplingParams(temperature=2.0, top_k=4, top_p=0.99, min_p=0.01, logit_bias=forced)
    gen = make_generator(0)
    assert {sample(x, hot, generator=gen, mask=mask).token for _ in range(500)} <= {1, 2}
    biased = SamplingParams(logit_bias={"2": 100})  # bias within the mask still applies
    gen = make_generator(0)
    assert {sample(x, biased, generator=gen, mask=mask).token for _ in range(200)} == {2}


def test_an_all_true_mask_changes_nothing_and_consumes_no_randomness():
    x = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0])
    params = SamplingParams(temperature=0.8, top_p=0.9)
    every = torch.ones(5, dtype=torch.bool)
    a, b = make_generator(3), make_generator(3)
    with_mask = [sample(x, params, generator=a, mask=every).token for _ in range(100)]
    assert with_mask == [sample(x, params, generator=b).token for _ in range(100)]
    assert torch.equal(a.get_state(), b.get_state())
    raw = torch.log_softmax(x, -1)
    mask = torch.tensor([True, True, False, False, False])
    got = sample(x, SamplingParams(temperature=0, logprobs=2), mask=mask)
    assert got.token == 0 and got.logprob == pytest.approx(float(raw[0]))  # the model's own
    assert [t for t, _ in got.top] == [3, 0]  # top logprobs are unmasked


@pytest.mark.parametrize("temperature", [1.0, 0.5, 1.7])
def test_draws_follow_the_tempered_softmax(temperature):
    x = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0])
    n = 20000
    counts = Counter(draws(SamplingParams(temperature=temperature), x, n, seed=11))
    expected = torch.softmax(x / temperature, -1).tolist()
    for token, p in enumerate(expected):
        # 5 standard deviations of a binomial proportion
        assert abs(counts[token] / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-3


def test_top_k_and_top_p_compose_in_order():
    x = logits_of([0.05, 0.3, 0.15, 0.5])
    # top_k=3 leaves {3, 1, 2}; renormalised 0.526/0.316/0.158: top_p 0.8 keeps {3, 1}
    params = SamplingParams(top_k=3, top_p=0.8)
    assert set(draws(params, x, 600)) == {1, 3}
    # min_p after top_k: 0.158 < 0.35 x 0.526, so token 2 goes
    assert set(draws(SamplingParams(top_k=3, min_p=0.35), x, 600)) == {1, 3}


def test_same_seed_same_draws_different_seeds_differ():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(top_p=0.95, top_k=200)
    assert draws(params, x, 200, seed=42) == draws(params, x, 200, seed=42)
    assert draws(params, x, 200, seed=42) != draws(params, x, 200, seed=43)
    unseeded = [[sample(x, params, generator=make_generator(None)).token for _ in range(50)]
                for _ in range(2)]
    assert unseeded[0] != unseeded[1]
    assert draws(params, x, 50, seed=-1) == draws(params, x, 50, seed=2**64 - 1)


def test_logprobs_are_the_raw_distribution():
    x = torch.tensor([2.0, 1.0, 0.0, -1.0, 3.0])
    raw = torch.log_softmax(x, -1)
    params = SamplingParams(temperature=0.3, logit_bias={"2": 50}, logprobs=3)
    got = sample(x, params, generator=make_generator(0))
    assert got.token == 2
    assert got.logprob == pytest.approx(float(raw[2]))
    assert [t for t, _ in got.top] == [4, 0, 1]
    assert [lp for _, lp in got.top] == pytest.approx(raw[[4, 0, 1]].tolist())
    assert sample(x, SamplingParams(logprobs=0)).top == ()
    assert sample(x, SamplingParams()).top == ()
    assert len(sample(x, SamplingParams(logprobs=20)).top) == 5  # capped by the vocabulary


def test_sample_accepts_bf16_and_never_writes_the_input():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    before = x.clone()
    params = SamplingParams(
        temperature=0.7, top_k=3, top_p=0.9, min_p=0.01, typical_p=0.95,
        repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
        logit_bias={"0": 1.0}, logprobs=2,
    )
    result = sample(x, params, {3: 2}, [1, 3], make_generator(1))
    assert isinstance(result, Draw) and 0 <= result.token < 4 and len(result.top) == 2
    assert torch.equal(x, before)


def test_token_history_tracks_counts_and_distinct_context():
    history = TokenHistory([5, 3, 5])
    assert sorted(history.context_ids.tolist()) == [3, 5]
    for token in [7, 3, 7, *range(100, 140)]:
        history.add(token)
    assert history.output_counts[7] == 2 and history.output_counts[3] == 1
    assert sorted(history.context_ids.tolist()) == [3, 5, 7, *range(100, 140)]
    x = torch.zeros(200)
    p = SamplingParams(presence_penalty=1.0, repetition_penalty=2.0, temperature=0)
    y = apply_penalties(x + 1, p, history.output_counts, history.context_ids)
    assert y[7] == 0.5 - 1.0 and y[5] == 0.5 and y[0] == 1.0
    assert TokenHistory([]).context_ids.numel() == 0


# --------------------------------------------------------------------------- validation


def test_from_request_reads_openai_fields():
    p = SamplingParams.from_request({
        "max_tokens": 0, "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.1,
        "typical_p": 0.9, "presence_penalty": -2, "frequency_penalty": 2,
        "repetition_penalty": 1.2, "logit_bias": {"50256": -100, "7": 3.5}, "seed": -5,
        "stop": "\n", "logprobs": 20, "ignore_eos": True, "model": "ignored", "n": 1,
    })
    assert p.max_tokens == 0 and p.greedy and p.top_k == 40 and p.seed == -5
    assert p.logit_bias == ((7, 3.5), (50256, -100.0))
    assert p.stop == ("\n",) and p.logprobs == 20 and p.ignore_eos
    assert SamplingParams.from_request({"stop": None, "temperature": None}) == SamplingParams()
    assert SamplingParams.from_request({"stop": ["a", "bc"]}).stop == ("a", "bc")


BAD = [
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", True),
    ("temperature", -0.1),
    ("temperature", 2.01),
    ("temperature", 1e-9),
    ("temperature", "0.5"),
    ("top_p", 0),
    ("top_p", 1.5),
    ("top_p", float("-inf")),
    ("top_k", -1),
    ("top_k", 5.0),
    ("top_k", False),
    ("min_p", 1.1),
    ("typical_p", 0.0),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3),
    ("repetition_penalty", 0),
    ("repetition_penalty", 2.5),
    ("max_tokens", -1),
    ("max_tokens", 10.5),
    ("max_tokens", "10"),
    ("seed", 2**63),
    ("seed", 1.0),
    ("logprobs", 21),
    ("logprobs", -1),
    ("logprobs", True),
    ("stop", ["a", "b", "c", "d", "e"]),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", ["ok", 3]),
    ("stop", 7),
    ("stop", "x" * 257),
    ("logit_bias", {"abc": 1}),
    ("logit_bias", {"-1": 1}),
    ("logit_bias", {"1.5": 1}),
    ("logit_bias", {"5": 100.5}),
    ("logit_bias", {"5": float("nan")}),
    ("logit_bias", {"5": "1"}),
    ("logit_bias", {"5": True}),
    ("logit_bias", {"5": 1, "005": 2}),
    ("logit_bias", {str(i): 1 for i in range(301)}),
    ("logit_bias", [1, 2]),
    ("ignore_eos", "yes"),
]


@pytest.mark.parametrize("name, value", BAD, ids=[f"{n}={str(v)[:12]}" for n, v in BAD])
def test_bad_parameters_name_the_field(name, value):
    with pytest.raises(ContractError) as err:
        SamplingParams.from_request({name: value})
    assert err.value.field == name
    with pytest.raises(ContractError) as err:
        SamplingParams.from_request({name: value}, prefix="body.")
    assert err.value.field == "body." + name


def test_messages_say_what_was_expected():
    with pytest.raises(ContractError, match=r"expected a number in \(0, 1\], got 0"):
        SamplingParams.from_request({"top_p": 0})
    with pytest.raises(ContractError, match="expected an integer from 0 to 20, got 21"):
        SamplingParams.from_request({"logprobs": 21})
    with pytest.raises(ContractError, match=r"expected 0 \(greedy\) or a number in \[1e-06, 2\]"):
        SamplingParams.from_request({"temperature": 1e-7})
    with pytest.raises(ContractError, match="got a boolean"):
        SamplingParams.from_request({"temperature": True})
    with pytest.raises(ContractError, match="at most 4 stop strings"):
        SamplingParams.from_request({"stop": list("abcde")})


def test_direct_construction_is_validated_too():
    with pytest.raises(ContractError) as err:
        SamplingParams(top_p=0.0)
    assert err.value.field == "top_p"
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(logit_bias={3: -1}).logit_bias == ((3, -1.0),)


def test_check_vocab_refuses_ids_outside_the_vocabulary():
    params = SamplingParams.from_request({"logit_bias": {"10": 1, "49151": -1}})
    check_vocab(params, 49152)
    with pytest.raises(ContractError) as err:
        check_vocab(params, 100)
    assert err.value.field == "logit_bias" and "49151" in err.value.message
