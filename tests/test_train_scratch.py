"""from-scratch: deterministic initialization, every served family, a servable checkpoint."""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors.torch import save
from train_support import RECORDS, REQUEST, single_thread, write_dataset

from onepass.train.config import Initialization, ModelGeometry, resolve_config
from onepass.train.scratch import build_model, load_tokenizer

GEOMETRY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)

one_thread = pytest.fixture(scope="module", autouse=True)(single_thread)


@pytest.fixture(scope="module")
def tokenizer():
    from onepass.models import resolve

    return load_tokenizer(resolve().path)


def digest(model) -> str:
    tensors = {k: v.detach().clone() for k, v in model.named_parameters()}
    return hashlib.sha256(save(tensors)).hexdigest()


def test_same_geometry_and_seed_give_byte_identical_tensors(tokenizer):
    geometry = ModelGeometry(architecture="qwen3", **GEOMETRY)
    a = build_model(geometry, Initialization(), tokenizer, seed=7)
    b = build_model(geometry, Initialization(), tokenizer, seed=7)
    c = build_model(geometry, Initialization(), tokenizer, seed=8)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)
    torch.manual_seed(123)  # the global RNG plays no part
    d = build_model(geometry, Initialization(), tokenizer, seed=7)
    assert digest(d) == digest(a)


def test_each_tensor_depends_only_on_seed_and_its_name(tokenizer):
    two = build_model(ModelGeometry(**GEOMETRY), Initialization(), tokenizer, seed=1)
    three = build_model(ModelGeometry(**{**GEOMETRY, "num_hidden_layers": 3}), Initialization(),
                        tokenizer, seed=1)
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(two.state_dict()[name], three.state_dict()[name])


def test_initializers_follow_the_configuration(tokenizer):
    init = Initialization(initializer_range=0.05, embedding_std=0.01, norm_weight=0.5,
                          bias_value=0.25)
    llama = build_model(ModelGeometry(**GEOMETRY, attention_bias=True), init, tokenizer, 0)
    sd = llama.state_dict()
    assert torch.all(sd["model.norm.weight"] == 0.5)
    assert torch.all(sd["model.layers.0.self_attn.q_proj.bias"] == 0.25)
    assert sd["model.layers.0.mlp.up_proj.weight"].std().item() == pytest.approx(0.05, rel=0.1)
    assert sd["model.embed_tokens.weight"].std().item() == pytest.approx(0.01, rel=0.05)
    gemma = build_model(ModelGeometry(architecture="gemma", **GEOMETRY), init, tokenizer, 0)
    # Gemma's RMSNorm multiplies by (1 + weight): the effective scale is still 0.5.
    assert torch.all(gemma.state_dict()["model.norm.weight"] == -0.5)
    untied = build_model(ModelGeometry(**GEOMETRY, tie_word_embeddings=False), init, tokenizer, 0)
    assert untied.state_dict()["lm_head.weight"].std().item() == pytest.approx(0.01, rel=0.05)


def test_geometry_errors_are_explicit(tokenizer):
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_model(ModelGeometry(**GEOMETRY, vocab_size=100), Initialization(), tokenizer, 0)
    with pytest.raises(ValueError, match="not a multiple"):
        build_model(ModelGeometry(**{**GEOMETRY, "hidden_size": 66}), Initialization(),
                    tokenizer, 0)
    with pytest.raises(ValueError, match="gemma3 keys"):
        build_model(ModelGeometry(**GEOMETRY, sliding_window_pattern=2), Initialization(),
                    tokenizer, 0)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
                                    "gemma3"])
def test_every_family_trains_and_serves_from_its_directory(family, tmp_path):
    from onepass.engine import DecisionEngine
    from onepass.train.loop import train

    extra = {"sliding_window": 16} if family in ("mistral", "gemma2", "gemma3") else {}
    flags = {("run", "method"): "from-scratch", ("run", "output_directory"): str(tmp_path / "o"),
             ("dataset", "path"): str(write_dataset(tmp_path / "d.jsonl", RECORDS[:4])),
             ("run", "epochs"): 1, ("run", "batch_size"): 6, ("run", "learning_rate"): 1e-3,
             ("model", "architecture"): family}
    flags.update({("model", k): v for k, v in {**GEOMETRY, **extra}.items()})
    result = train(resolve_config(flags), show_progress=False)
    assert result.optimizer_steps == 2 and result.history[0]["train_loss"] > 0
    out = tmp_path / "o"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    engine = DecisionEngine.from_pretrained(str(out))
    answer = engine.answer(REQUEST)["answers"]["team"]
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0)


def test_a_bare_tokenizer_json_gives_a_plain_prompt_checkpoint(tmp_path):
    from onepass.engine import DecisionEngine
    from onepass.models import resolve
    from onepass.prompt import PLAIN_FORMAT
    from onepass.train.loop import train

    flags = {("run", "method"): "from-scratch", ("run", "output_directory"): str(tmp_path / "o"),
             ("dataset", "path"): str(write_dataset(tmp_path / "d.jsonl", RECORDS[:2])),
             ("run", "epochs"): 1, ("run", "batch_size"): 6,
             ("tokenizer", "file"): str(resolve().path / "tokenizer.json")}
    flags.update({("model", k): v for k, v in GEOMETRY.items()})
    train(resolve_config(flags), show_progress=False)
    engine = DecisionEngine.from_pretrained(str(tmp_path / "o"))
    assert engine.format == PLAIN_FORMAT  # no chat template came with the file
    assert engine.answer(REQUEST)["answers"]["team"]["choice"] in {"billing", "logistics",
                                                                    "support"}
