"""typed-lm's names on onepass's commands: its flag spellings as aliases of the equivalent
onepass flags (same destination, same environment variable), its quantize ``--device`` (the
CPU only: anything else is refused by name), and its trainer TOML (``quantization = "none"``,
``quantization_mode``) parsed, checked and acted on."""

from __future__ import annotations

import pytest

from onepass.cli import build_parser
from onepass.commands.train import post_training_quantize
from onepass.train.config import ConfigError, resolve_config

# typed-lm's "Full example" of its configuration file, verbatim but for the paths
TYPED_LM_TOML = """
[run]
method = "from-scratch"
seed = 42
output_directory = "{out}"
model_id = "Qwen/Qwen2.5-1.5B-Instruct"
quantization = "none"
quantization_mode = "post-training"
device = "auto"
maximum_gradient_norm = 1.0
minimum_improvement = 0.0
early_stop_patience = 0
max_sequence_length = 1024
warmup_steps = 10
weight_decay = 0.0
learning_rate = 1e-4
batch_size = 4
gradient_accumulation_steps = 1
epochs = 3
lora_rank = 16
lora_alpha = 32.0
lora_dropout = 0.0

[model]
architecture = "qwen3"
vocab_size = 151936
hidden_size = 1024
intermediate_size = 4096
num_hidden_layers = 16
num_attention_heads = 16
num_key_value_heads = 4
max_position_embeddings = 4096
rope_theta = 1000000.0
rms_norm_eps = 1e-6
tie_word_embeddings = true

[initialization]
initializer_range = 0.02
embedding_std = 0.02
norm_weight = 1.0
bias_value = 0.0

[dataset]
path = "resources/dataset.jsonl"

[tokenizer]
file = "tokenizer.json"
"""


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("command", ["serve", "decide", "eval"])
def test_model_flags_take_typed_lm_spellings(command):
    extra = ["--input", "in.jsonl", "--output", "o"] if command == "decide" else []
    extra = ["--dataset", "clinc150"] if command == "eval" else extra
    args = parse(command, "--model-id", "some/dir", "--model-dtype", "float32",
                 "--adapter-directory", "out/train", *extra)
    model = args.model[0] if command == "serve" else args.model
    assert (model, args.dtype, args.adapter) == ("some/dir", "float32", "out/train")


def test_aliases_share_the_environment_variable(monkeypatch):
    monkeypatch.setenv("ONEPASS_DTYPE", "float32")
    assert parse("serve").dtype == "float32"
    assert parse("serve", "--model-dtype", "bfloat16").dtype == "bfloat16"  # flag > env


def test_quantize_and_merge_take_typed_lm_spellings():
    q = parse("quantize", "--model-id", "base", "--adapter-directory", "out/train",
              "--quantization", "fp8", "--output-directory", "q", "--device", "cpu")
    assert (q.model, q.adapter, q.device) == ("base", "out/train", "cpu")
    m = parse("merge", "--model-id", "base", "--adapter-directory", "a", "--output-directory", "o")
    assert (m.model, m.adapter) == ("base", "a")


def test_quantize_refuses_a_device_it_does_not_run_on(capsys):
    from onepass.commands import quantize

    args = parse("quantize", "--quantization", "fp8", "--output-directory", "q",
                 "--device", "cuda")
    assert quantize.run(args) == 2
    assert "--device cuda is not supported" in capsys.readouterr().err


def test_typed_lm_full_example_parses(tmp_path):
    path = tmp_path / "training.toml"
    path.write_text(TYPED_LM_TOML.format(out=tmp_path / "out"))
    config = resolve_config({}, path)
    run = config.run
    assert (run.quantization, run.quantization_mode) == ("none", "post-training")
    assert run.model == "Qwen/Qwen2.5-1.5B-Instruct" and run.epochs == 3
    assert config.model.architecture == "qwen3" and config.tokenizer.file == "tokenizer.json"
    assert post_training_quantize(config) is None  # none: nothing to quantize afterwards
    flags = {("run", "quantization_mode"): "training", ("run", "quantization"): "int4"}
    assert resolve_config(flags, path).run.quantization_mode == "training"  # flag > TOML


@pytest.mark.parametrize(("run", "words"), [
    ('method = "qlora"\nquantization_mode = "post-training"\nquantization = "fp8"',
     "qlora quantizes its base while it trains"),
    ('method = "qlora"\nquantization = "none"', "qlora trains over a quantized base"),
    ('method = "lora"\nquantization_mode = "post-training"', "quantization int4 with"),
    ('quantization_mode = "after"', "quantization_mode: expected one of training, "
     "post-training"),
])
def test_meaningless_quantization_pairs_are_refused(tmp_path, run, words):
    path = tmp_path / "t.toml"
    path.write_text(f"[run]\n{run}\n")
    with pytest.raises(ConfigError, match=words):
        resolve_config({}, path)


def test_weights_file_names_a_gguf_inside_the_model_directory(tmp_path):
    from onepass.commands.common import apply_weights_file
    from onepass.models import EMBEDDED, EMBEDDED_DEFAULT, resolve

    gguf = EMBEDDED[EMBEDDED_DEFAULT]()
    args = parse("serve", "--model-id", str(gguf.parent), "--weights-file", gguf.name)
    apply_weights_file(args)
    assert args.model == [str(gguf.parent / gguf.name)]
    # the same conversion the embedded alias loads: the same weights
    assert resolve(args.model[0]).path == resolve(EMBEDDED_DEFAULT).path
    one = parse("decide", "--model", str(gguf.parent), "--weights-file", gguf.name,
                "--input", "i", "--output", "o")
    apply_weights_file(one)
    assert one.model == str(gguf)


@pytest.mark.parametrize(("model", "filename", "words"), [
    ("some/repo", "/etc/passwd.gguf", "expected a file name inside"),
    ("some/repo", "../up.gguf", "expected a file name inside"),
    ("some/repo", "model.safetensors", "only a .gguf file"),
    (None, "m.gguf", "needs --model"),
    ("{tmp}", "absent.gguf", "not found"),
    ("./no-such-dir", "m.gguf", "not a directory or a hub repository"),
])
def test_weights_file_refusals(tmp_path, model, filename, words):
    from onepass.models import ModelError, weights_file

    model = model.format(tmp=tmp_path) if model else model
    with pytest.raises(ModelError, match=words):
        weights_file(model, filename)


def test_weights_file_with_several_models_is_refused():
    from onepass.commands.common import apply_weights_file

    args = parse("serve", "--model", "a", "--model", "b", "--weights-file", "m.gguf")
    with pytest.raises(SystemExit, match="exactly one --model"):
        apply_weights_file(args)
