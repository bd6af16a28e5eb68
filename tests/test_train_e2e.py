"""End to end: train --method from-scratch on a tiny geometry, serve that directory over HTTP,
and get a typed answer back (the CLI, the artifact and the server agree on the layout)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from train_support import REQUEST, ROOT, post_decision, serving, write_dataset

pytest.importorskip("fastapi")
# the tiny geometry both tests train (typed-lm's [model] table)
GEOMETRY = """
hidden_size = 64
intermediate_size = 128
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 1024
"""


def train(config, *flags: str) -> None:
    """`onepass train --configuration-file config` in its own process, one thread."""
    done = subprocess.run(
        [sys.executable, "-m", "onepass.cli", "train", "--configuration-file", str(config),
         *flags],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_from_scratch_train_then_serve_answers(tmp_path):
    dataset = write_dataset(tmp_path / "train.jsonl")
    config = tmp_path / "scratch.toml"
    config.write_text(f"""
[run]
method = "from-scratch"
seed = 3
epochs = 1
batch_size = 8
learning_rate = 1e-3
output_directory = "{tmp_path / 'scratch'}"

[model]
architecture = "qwen3"
num_hidden_layers = 2{GEOMETRY}
[dataset]
path = "{dataset}"
""")
    train(config, "--num-hidden-layers", "1")
    out = tmp_path / "scratch"
    assert (out / "model.safetensors").is_file()
    import json

    config_json = json.loads((out / "config.json").read_text())
    assert config_json["model_type"] == "qwen3"
    assert config_json["num_hidden_layers"] == 1  # the flag beat the TOML key

    with serving(["--model", str(out)], tmp_path / "serve.log") as url:
        body = post_decision(url, REQUEST)
    answers = body["answers"]
    assert answers["refund"]["type"] == "noul" and 0.0 <= answers["refund"]["noul"] <= 1.0
    assert answers["team"]["choice"] in {"billing", "logistics", "support"}
    assert sum(answers["team"]["probabilities"].values()) == pytest.approx(1.0)
    assert set(answers["urgency"]["legend"]) == {"0", "1", "2"}
    assert body["usage"]["input_tokens"] > 0


def test_typed_lm_post_training_quantization(tmp_path):
    """typed-lm's [run] quantization_mode = "post-training": the trained checkpoint is
    quantized at the end of `onepass train` (here to fp8), and the result loads and answers."""
    dataset = write_dataset(tmp_path / "train.jsonl")
    config = tmp_path / "typed-lm.toml"
    config.write_text(f"""
[run]
method = "from-scratch"
seed = 3
epochs = 1
batch_size = 8
output_directory = "{tmp_path / 'scratch'}"
quantization = "fp8"
quantization_mode = "post-training"

[model]
architecture = "llama"
num_hidden_layers = 1{GEOMETRY}
[dataset]
path = "{dataset}"
""")
    train(config)
    import json

    quantized = tmp_path / "scratch" / "quantized"
    assert json.loads((quantized / "quantization_config.json").read_text())["scheme"] \
        == "fp8"
    from onepass import DecisionEngine

    engine = DecisionEngine.from_pretrained(str(quantized), dtype="float32")
    answer = engine.answer(REQUEST)["answers"]["refund"]
    assert answer["type"] == "noul" and 0.0 <= answer["noul"] <= 1.0
