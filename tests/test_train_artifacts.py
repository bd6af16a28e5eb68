"""Artifact layouts of every method, and adapter merge == adapter at load == the trained model.

A tiny random-weight llama with the real SmolLM2 tokenizer stands in for the base: these tests
check layouts and arithmetic, not learning."""

from __future__ import annotations

import argparse
import json
import logging
import re

import pytest
import torch
from safetensors import safe_open
from train_support import REQUEST, answers_probs, single_thread, tiny_base, write_dataset

from onepass.adapters import AdapterError, apply_adapter, read_adapter
from onepass.backends.torch import TorchBackend
from onepass.engine import DecisionEngine
from onepass.train.config import resolve_config
from onepass.train.loop import train

ADAPTER_NAME = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.lora_[ab]$"
)

one_thread = pytest.fixture(scope="module", autouse=True)(single_thread)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_base(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data") / "train.jsonl")


def run(method: str, base, dataset, out, **extra):
    flags = {("run", "method"): method, ("run", "model"): str(base),
             ("run", "output_directory"): str(out), ("dataset", "path"): str(dataset),
             ("run", "epochs"): 1, ("run", "batch_size"): 8, ("run", "learning_rate"): 2e-2,
             ("run", "warmup_steps"): 0, ("run", "lora_rank"): 4, ("run", "lora_alpha"): 8.0}
    flags.update({("run", k): v for k, v in extra.items()})
    return train(resolve_config(flags), show_progress=False)


def engine_answers(model_dir, adapter=None) -> dict:
    backend = TorchBackend.load(model_dir, name="t", device="cpu", dtype="float32",
                                adapter=adapter)
    return DecisionEngine(backend).answer(REQUEST)


def tensor_names(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


@pytest.fixture(scope="module")
def lora_run(base, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    return run("lora", base, dataset, out), out


def test_lora_writes_only_the_adapter(lora_run, base):
    result, out = lora_run
    assert {p.name for p in out.iterdir()} == {
        "adapter.safetensors", "adapter_config.json", "training_summary.json", "checkpoint"}
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["rank"] == 4 and config["alpha"] == 8.0
    assert config["base"] == str(base) and config["architecture"] == "llama"
    from onepass.prompt import PROMPT_VERSION

    assert config["prompt_version"] == PROMPT_VERSION and config["method"] == "lora"
    names = tensor_names(out / "adapter.safetensors")
    assert names and all(ADAPTER_NAME.match(n) for n in names), sorted(names)[:3]
    assert len(names) == 2 * 7 * 2  # a and b, 7 projections, 2 layers
    _, tensors = read_adapter(out)
    assert tensors["model.layers.0.self_attn.q_proj.lora_a"].shape == (4, 64)
    assert tensors["model.layers.0.mlp.down_proj.lora_b"].shape == (64, 4)
    assert any(t.abs().sum() > 0 for n, t in tensors.items() if n.endswith("lora_b"))
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["train_examples"] == 24 and result.optimizer_steps == 3


def test_adapter_at_load_equals_the_trained_peft_model_and_the_merge(lora_run, base, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from onepass.cli import main
    from onepass.train.lora import apply_lora, load_adapter_tensors

    _, out = lora_run
    at_load = engine_answers(base, adapter=out)
    plain = engine_answers(base)
    assert max(abs(a - b) for a, b in zip(answers_probs(at_load), answers_probs(plain))) > 1e-4

    # The trained model as peft runs it (adapters unmerged, computed on the side).
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = apply_lora(model, rank=4, alpha=8.0, dropout=0.0,
                            target_modules=json.loads((out / "adapter_config.json").read_text())
                            ["target_modules"])
    _, tensors = read_adapter(out)
    load_adapter_tensors(peft_model, tensors)
    live_backend = TorchBackend(peft_model.get_base_model(), AutoTokenizer.from_pretrained(base),
                                name="t")
    live = DecisionEngine(live_backend).answer(REQUEST)
    assert answers_probs(live) == pytest.approx(answers_probs(at_load), abs=1e-5)

    # onepass merge writes a checkpoint that serves the same answers with no adapter step.
    merged = tmp_path / "merged"
    assert main(["merge", "--model", str(base), "--adapter", str(out),
                 "--output-directory", str(merged)]) == 0
    assert tensor_names(merged / "model.safetensors") == tensor_names(base / "model.safetensors")
    assert answers_probs(engine_answers(merged)) == pytest.approx(answers_probs(at_load),
                                                                  abs=1e-6)


def test_full_writes_a_servable_checkpoint(base, dataset, tmp_path):
    out = tmp_path / "full"
    run("full", base, dataset, out, learning_rate=1e-3)
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
            "training_summary.json"} <= files
    assert not {"adapter.safetensors", "adapter_config.json"} & files
    names = tensor_names(out / "model.safetensors")
    assert names == tensor_names(base / "model.safetensors")
    assert {"model.embed_tokens.weight", "model.norm.weight",
            "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.input_layernorm.weight"} <= names
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    trained, plain = engine_answers(out), engine_answers(base)
    assert max(abs(a - b) for a, b in zip(answers_probs(trained), answers_probs(plain))) > 1e-4


def test_quantized_linear_round_trip():
    from onepass.quant.formats import codec_for
    from onepass.quant.linear import QuantizedLinear

    torch.manual_seed(0)
    linear = torch.nn.Linear(100, 24, bias=True)  # 100 is not a multiple of the block
    x = torch.randn(3, 100)
    for name, block in (("int8", None), ("int4", 32)):
        q = QuantizedLinear.from_linear(linear, codec_for(name, block))
        error = (q.dequantize() - linear.weight).abs()
        if name == "int8":
            assert q.qweight.dtype == torch.int8 and q.qweight.shape == (24, 100)
            assert torch.all(error <= q.scale / 2 + 1e-7)
        else:
            assert q.qweight.dtype == torch.uint8 and q.qweight.shape == (24, 64)  # packed
            assert error.max() <= q.scale.max() / 2 + 1e-7
        assert torch.allclose(q(x), x @ q.dequantize().T + linear.bias, atol=1e-5)
        assert (q(x) - linear(x)).abs().max() < (0.05 if name == "int8" else 0.3)


def test_qlora_trains_adapters_over_a_quantized_base(base, dataset, tmp_path):
    from transformers import AutoModelForCausalLM

    from onepass.quant.linear import QuantizedLinear
    from onepass.train.loop import prepare_method

    for scheme in ("int8", "fp8", "fp4"):
        config = resolve_config({("run", "method"): "qlora", ("run", "quantization"): scheme})
        module = prepare_method(AutoModelForCausalLM.from_pretrained(base), config)
        quantized = [m for m in module.modules() if isinstance(m, QuantizedLinear)]
        assert len(quantized) == 14  # every projection of both layers
        assert {m.codec.name for m in quantized} == {"mxfp4" if scheme == "fp4" else scheme}
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)

    out = tmp_path / "qlora"
    run("qlora", base, dataset, out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["method"] == "qlora" and config["quantization"] == "int4"
    assert all(ADAPTER_NAME.match(n) for n in tensor_names(out / "adapter.safetensors"))
    answers = engine_answers(base, adapter=out)  # merges into the float base at load
    assert sum(answers["answers"]["team"]["probabilities"].values()) == pytest.approx(1.0)


def test_adapter_errors_are_explicit(lora_run, tmp_path, caplog):
    from transformers import AutoModelForCausalLM, LlamaConfig

    _, out = lora_run
    with pytest.raises(AdapterError, match="not an adapter directory"):
        apply_adapter(torch.nn.Linear(2, 2), tmp_path)
    other = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2))
    shapes = r"down_proj is \(32, 64\) in the base but the adapter expects \(64, 128\)"
    with pytest.raises(AdapterError, match=shapes):
        apply_adapter(other, out)
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "adapter.safetensors").write_bytes((out / "adapter.safetensors").read_bytes())
    config = json.loads((out / "adapter_config.json").read_text())
    (stale / "adapter_config.json").write_text(json.dumps({**config,
                                                           "prompt_version": "old-prompt"}))
    from transformers import AutoModelForCausalLM as Auto

    base_model = Auto.from_pretrained(config["base"])
    with caplog.at_level(logging.WARNING, logger="onepass.adapters"):
        apply_adapter(base_model, stale)
    assert "old-prompt" in caplog.text


def test_a_trained_adapter_carries_its_calibration_and_the_engine_applies_it(base, tmp_path):
    """The trainer fits one temperature per question type on the kept weights' validation
    answers and writes it beside the adapter; loading the adapter applies it (every served
    distribution is the uncalibrated one sharpened or softened by T), --calibration none drops
    it. Records of a tiny random model: this proves the plumbing, not the fit."""
    import math

    from onepass.commands.common import apply_quality
    from onepass.train.config import (
        AUTO_VALIDATION_RECORDS,
        DEFAULT_VALIDATION_SPLIT,
        validation_split,
    )

    records = write_dataset(tmp_path / "train.jsonl")
    out = tmp_path / "adapter"
    flags = {("run", "method"): "lora", ("run", "model"): str(base),
             ("run", "output_directory"): str(out), ("dataset", "path"): str(records),
             ("dataset", "validation_split"): 0.25, ("run", "epochs"): 1,
             ("run", "batch_size"): 8, ("run", "learning_rate"): 2e-2, ("run", "warmup_steps"): 0,
             ("run", "lora_rank"): 4, ("run", "lora_alpha"): 8.0}
    result = train(resolve_config(flags), show_progress=False)
    assert result.validation_examples == 6  # 2 records x 3 questions
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["method"] == "temperature"
    assert set(saved["type_temperature"]) == {"noul", "choice", "score"}
    assert all(0 < t < math.inf for t in saved["type_temperature"].values())
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["calibration"]["choice"]["temperature"] == saved["type_temperature"]["choice"]

    engine = DecisionEngine.from_pretrained(str(base), adapter=str(out), device="cpu",
                                            dtype="float32")
    assert engine.calibration.type_temperature == saved["type_temperature"]
    served = engine.answer(REQUEST)["answers"]["team"]["probabilities"]
    apply_quality(engine, argparse.Namespace(calibration="none"))
    assert engine.calibration is None
    raw = engine.answer(REQUEST)["answers"]["team"]["probabilities"]
    t = saved["type_temperature"]["choice"]
    scaled = {k: v ** (1 / t) for k, v in raw.items()}
    assert served == pytest.approx({k: v / sum(scaled.values()) for k, v in scaled.items()},
                                   abs=1e-6)

    # the default split: a tenth of a set of 50+ records, none for fewer, 0 or a file: none
    config = resolve_config({("dataset", "path"): str(records)})
    assert validation_split(config, AUTO_VALIDATION_RECORDS - 1) == 0.0
    assert validation_split(config, AUTO_VALIDATION_RECORDS) == DEFAULT_VALIDATION_SPLIT
    assert validation_split(resolve_config({("dataset", "validation_split"): 0.0}), 500) == 0.0
    assert validation_split(resolve_config({("dataset", "validation_path"): "v.jsonl"}),
                            500) == 0.0
