"""TOML configuration: precedence flag > TOML > default per key; errors name file and key."""

from __future__ import annotations

import pytest

from onepass.commands import train as train_command
from onepass.train.config import (
    ConfigError,
    TrainConfig,
    check_complete,
    read_toml,
    resolve_config,
    settings,
)


def toml(tmp_path, text: str):
    path = tmp_path / "train.toml"
    path.write_text(text)
    return path


def parse_flags(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    args = parser.parse_args(argv)
    return train_command.flags_from_args(args), args.configuration_file


def test_defaults_without_flags_or_file():
    config = resolve_config({})
    assert config.dataset == TrainConfig().dataset and config.model == TrainConfig().model
    assert config.run.epochs == 3 and config.run.method == "lora" and config.run.seed == 42
    # the measured adapter recipe; full fine-tuning keeps a gentler decaying rate
    assert (config.run.learning_rate, config.run.lr_schedule, config.run.lora_rank,
            config.run.lora_alpha, config.run.lora_layers) == (1e-3, "constant", 8, 16.0, 8)
    full = resolve_config({("run", "method"): "full"}).run
    assert (full.learning_rate, full.lr_schedule) == (1e-4, "linear")
    given = resolve_config({("run", "learning_rate"): 5e-4, ("run", "lr_schedule"): "cosine"})
    assert (given.run.learning_rate, given.run.lr_schedule) == (5e-4, "cosine")


def test_precedence_is_per_key(tmp_path):
    path = toml(tmp_path, """
[run]
epochs = 9
batch_size = 2
learning_rate = 3e-4
[dataset]
path = "from-toml.jsonl"
[model]
architecture = "qwen3"
hidden_size = 128
""")
    flags, file = parse_flags(["--configuration-file", str(path), "--epochs", "5",
                               "--hidden-size", "64", "--dataset", "flag.jsonl"])
    config = resolve_config(flags, file)
    assert config.run.epochs == 5  # flag beats TOML
    assert config.run.batch_size == 2  # TOML beats default
    assert config.run.learning_rate == 3e-4
    assert config.run.weight_decay == 0.0  # default
    assert config.model.hidden_size == 64 and config.model.architecture == "qwen3"
    assert config.dataset.path == "flag.jsonl"


def test_flag_equal_to_default_still_beats_toml(tmp_path):
    path = toml(tmp_path, "[run]\nepochs = 9\n")
    flags, file = parse_flags(["--configuration-file", str(path), "--epochs", "3"])
    assert resolve_config(flags, file).run.epochs == 3


def test_bool_and_list_flags(tmp_path):
    path = toml(tmp_path, '[run]\nresume = true\nlora_target_modules = ["q_proj"]\n'
                          "[model]\ntie_word_embeddings = false\n")
    flags, file = parse_flags(["--configuration-file", str(path), "--no-resume",
                               "--lora-target-modules", "q_proj,v_proj"])
    config = resolve_config(flags, file)
    assert config.run.resume is False
    assert config.run.lora_target_modules == ["q_proj", "v_proj"]
    assert config.model.tie_word_embeddings is False  # TOML only


def test_integer_is_accepted_for_a_float_key(tmp_path):
    values = read_toml(toml(tmp_path, "[run]\nlearning_rate = 1\n"))
    assert values[("run", "learning_rate")] == 1.0
    assert isinstance(values[("run", "learning_rate")], float)


def test_initialization_section_has_no_flags(tmp_path):
    assert all(s.flag is None for s in settings() if s.section == "initialization")
    path = toml(tmp_path, "[initialization]\ninitializer_range = 0.05\nnorm_weight = 0.5\n")
    config = resolve_config({}, path)
    assert config.initialization.initializer_range == 0.05
    assert config.initialization.embedding_std == 0.02


def test_reference_spelling_model_id_is_accepted(tmp_path):
    config = resolve_config({}, toml(tmp_path, '[run]\nmodel_id = "some/dir"\n'))
    assert config.run.model == "some/dir"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[run]\nepocs = 3\n", "[run] unknown key 'epocs'; expected one of method"),
        ('[run]\nepochs = "three"\n', "[run] epochs: expected an integer, got 'three'"),
        ("[run]\nepochs = 2.5\n", "[run] epochs: expected an integer, got float 2.5"),
        ("[run]\nepochs = true\n", "[run] epochs: expected an integer, got bool True"),
        ('[run]\nlearning_rate = "fast"\n', "[run] learning_rate: expected a number"),
        ("[run]\nresume = 1\n", "[run] resume: expected a boolean"),
        ('[run]\nmethod = "dora"\n', "[run] method: expected one of lora, qlora"),
        ("[run]\nepochs = 0\n", "[run] epochs: expected a value >= 1"),
        ("[training]\nepochs = 3\n", "unknown section [training]"),
        ("epochs = 3\n", "top-level key 'epochs'; every key belongs in a section"),
        ("[model]\nhidden = 64\n", "[model] unknown key 'hidden'"),
        ("[tokenizer]\nfile = 3\n", "[tokenizer] file: expected a string"),
        ('[run]\nlora_target_modules = "q_proj"\n', "expected an array of strings"),
        ("[run\nepochs = 3\n", "invalid TOML"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path, text, fragment):
    path = toml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        resolve_config({}, path)
    message = str(info.value)
    assert message.startswith(f"configuration file error in '{path}': ")
    assert fragment in message


def test_missing_file_is_reported_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml': file not found"):
        resolve_config({}, tmp_path / "nope.toml")


def test_bad_flag_value_names_the_flag():
    with pytest.raises(ConfigError, match="--epochs: expected a value >= 1"):
        resolve_config({("run", "epochs"): 0})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_refused_from_flags_and_files(tmp_path, value):
    with pytest.raises(ConfigError, match=f"--validation-split: expected a finite number, got "
                                          f"{value!r}"):
        resolve_config({("dataset", "validation_split"): value})
    path = toml(tmp_path, f"[run]\nlearning_rate = {value!r}\n")
    with pytest.raises(ConfigError, match="learning_rate: expected a finite number"):
        resolve_config({}, path)


def test_required_settings_and_conflicts():
    with pytest.raises(ConfigError, match="training dataset is required"):
        check_complete(resolve_config({("run", "output_directory"): "o"}))
    with pytest.raises(ConfigError, match="output directory is required"):
        check_complete(resolve_config({("dataset", "path"): "d.jsonl"}))
    with pytest.raises(ConfigError, match="either a validation dataset or a validation split"):
        check_complete(resolve_config({
            ("dataset", "path"): "d.jsonl", ("run", "output_directory"): "o",
            ("dataset", "validation_path"): "v.jsonl", ("dataset", "validation_split"): 0.1}))
    with pytest.raises(ConfigError, match="lora_target_modules"):
        check_complete(resolve_config({
            ("dataset", "path"): "d.jsonl", ("run", "output_directory"): "o",
            ("run", "lora_target_modules"): ["qkv"]}))


def test_every_flag_is_documented_with_its_toml_key():
    import argparse

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for s in settings():
        if s.flag:
            assert f"--{s.flag}" in text
            assert f"TOML [{s.section}] {s.key})" in text
