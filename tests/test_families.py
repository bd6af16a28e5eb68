"""Every supported family runs the fast path exactly: tiny random-weight models built from a
config, with a real tokenizer (SmolLM2's). Sliding windows are set smaller than the prompt so
the windowed masks are exercised. Random weights prove plumbing, not decision quality."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from onepass.backends.torch import TorchBackend
from onepass.engine import DecisionEngine
from onepass.models import ModelError, check_family, resolve

COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=2048,
)
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 24},
    "qwen2": {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 2},
    "qwen3": {"head_dim": 16},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": 24},
    "gemma3_text": {"head_dim": 16, "sliding_window": 24},
}
REQUEST = {
    "state": "The parcel arrived crushed; the customer wants a refund or a replacement soon. "
             "They paid by card and have been a member for six years.",
    "questions": {
        "n": {"type": "noul", "instructions": "The customer wants money back."},
        "c": {"type": "choice", "instructions": "Which team?",
              "criteria": {"billing": "payments", "logistics": "shipping", "support": None}},
        "s": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve().path)


def tiny_model(family: str, vocab: int):
    torch.manual_seed(0)
    config = CONFIG_MAPPING[family](vocab_size=vocab, **COMMON, **FAMILIES[family])
    attn = "eager" if family == "gemma2" else "sdpa"
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


def probs(answer):
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_fast_path_matches_full_forward(family, tokenizer):
    model = tiny_model(family, len(tokenizer))
    engine = DecisionEngine(TorchBackend(model, tokenizer, name=family))
    for _ in range(2):  # miss, then cache hit
        fast = engine.answer(REQUEST)
        naive = engine.answer(REQUEST, naive=True)
        for name in REQUEST["questions"]:
            a, b = probs(fast["answers"][name]), probs(naive["answers"][name])
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (family, name)
        window = FAMILIES[family].get("sliding_window")
        assert window is None or fast["usage"]["input_tokens"] > 3 * window


def test_checkpoint_directory_round_trip(tmp_path, tokenizer):
    model = tiny_model("qwen3", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert check_family(tmp_path / "config.json") == "qwen3"
    engine = DecisionEngine.from_pretrained(str(tmp_path))
    assert engine.served_name == tmp_path.name
    loaded = engine.answer(REQUEST)["answers"]["c"]["probabilities"]
    direct = DecisionEngine(TorchBackend(model, tokenizer, name="x")).answer(REQUEST)
    assert loaded == pytest.approx(direct["answers"]["c"]["probabilities"], abs=1e-5)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3", "bert"])
def test_unsupported_families_are_refused_at_load_with_a_reason(family, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": family}))
    with pytest.raises(ModelError) as info:
        check_family(tmp_path / "config.json")
    assert family in str(info.value) and "llama" in str(info.value)


def test_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelError, match="without config.json"):
        resolve(str(tmp_path))
