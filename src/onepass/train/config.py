"""Training configuration: one dataclass per TOML section, one precedence rule per key.

Every setting is a documented dataclass field; the CLI flags and the TOML keys are generated
from the same fields, so they cannot drift apart. Each key resolves on its own:

    CLI flag (given)  >  TOML key (present)  >  built-in default

Unknown sections, unknown keys and wrong types are errors that name the file and the key::

    configuration file error in 'train.toml': [run] unknown key 'epocs'; expected one of ...
    configuration file error in 'train.toml': [run] epochs: expected an integer, got "three"

Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onepass.option_order import OPTION_ORDERS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

METHODS = ("lora", "qlora", "full", "from-scratch")
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The adapter defaults (with rank 8, alpha 16, the last 8 layers, LoRA+ 16, a constant rate
# after 10 warm-up steps) were measured on CLINC150 10-domain routing, 400 records, 2 epochs, on
# the embedded model: held-out accuracy 0.10 -> 0.55 in 6.7 minutes on 2 busy cores. The old
# ones (1e-4 decaying, rank 16, every layer) reached 0.12 in 15 minutes. Full fine-tuning moves
# every weight: it keeps the gentler 1e-4.
ADAPTER_LEARNING_RATE = 1e-3
FULL_LEARNING_RATE = 1e-4
# Without a validation set a run keeps its last epoch and cannot fit its calibration: by
# default a tenth of a set of 50 or more records is held out for both (below that a tenth is
# too few questions to judge or fit anything, and every record trains).
DEFAULT_VALIDATION_SPLIT = 0.1
AUTO_VALIDATION_RECORDS = 50


class ConfigError(ValueError):
    """A bad setting: names the file and key (TOML) or the flag (CLI)."""


def _f(default: Any, help: str, *, type: Any, flag: bool = True, choices: tuple | None = None,
       minimum: float | None = None, optional: bool = False) -> Any:
    meta = {"help": help, "type": type, "flag": flag, "choices": choices, "minimum": minimum,
            "optional": optional}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    """[run]: what to train and how."""

    method: str = _f("lora", "training method", type=str, choices=METHODS)
    model: str | None = _f(None, "base model: embedded alias, .gguf, checkpoint directory or hub "
                           "id (default: the embedded model; ignored by from-scratch)",
                           type=str, optional=True)
    output_directory: str | None = _f(None, "where the artifact and checkpoints go (required)",
                                      type=str, optional=True)
    seed: int = _f(42, "seed for initialization, shuffling and dropout", type=int)
    device: str = _f("auto", "auto, cpu, cuda or mps", type=str,
                     choices=("auto", "cpu", "cuda", "mps"))
    compute_dtype: str = _f("auto", "compute dtype; master weights stay float32 (auto: bfloat16 "
                            "on a GPU that supports it, float32 on CPU)", type=str,
                            choices=("auto", "float32", "bfloat16"))
    threads: int = _f(0, "CPU threads for torch (0: torch's default)", type=int, minimum=0)
    epochs: int = _f(3, "passes over the training set", type=int, minimum=1)
    batch_size: int = _f(4, "questions per micro-batch", type=int, minimum=1)
    gradient_accumulation_steps: int = _f(1, "micro-batches per optimizer step", type=int,
                                          minimum=1)
    learning_rate: float | None = _f(None, "peak AdamW learning rate (default: 1e-3 for lora "
                                     "and qlora, 1e-4 for full and from-scratch)", type=float,
                                     minimum=0.0, optional=True)
    weight_decay: float = _f(0.0, "AdamW weight decay (matrices only, not norms or biases)",
                             type=float, minimum=0.0)
    warmup_steps: int = _f(10, "linear warm-up steps", type=int, minimum=0)
    lr_schedule: str | None = _f(None, "after warm-up: linear decay to zero, cosine decay to "
                                 "zero, or constant (default: constant for lora and qlora, "
                                 "linear otherwise)", type=str,
                                 choices=("linear", "cosine", "constant"), optional=True)
    maximum_gradient_norm: float = _f(1.0, "clip the global gradient norm (0: no clipping)",
                                      type=float, minimum=0.0)
    early_stop_patience: int = _f(0, "stop after this many epochs without validation-loss "
                                  "improvement (0: never)", type=int, minimum=0)
    minimum_improvement: float = _f(0.0, "a validation loss must beat the best by this much to "
                                    "count as an improvement", type=float, minimum=0.0)
    max_sequence_length: int = _f(4096, "refuse examples longer than this many tokens (nothing "
                                  "is truncated)", type=int, minimum=1)
    lora_rank: int = _f(8, "LoRA rank", type=int, minimum=1)
    lora_alpha: float = _f(16.0, "LoRA alpha (scale = alpha / rank)", type=float, minimum=0.0)
    lora_dropout: float = _f(0.0, "dropout on the LoRA input", type=float, minimum=0.0)
    lora_b_learning_rate_ratio: float = _f(16.0, "LoRA+: the B matrices learn this many times "
                                           "faster than A (1: plain LoRA); 16 reached a given "
                                           "CLINC150 accuracy with about half the examples",
                                           type=float, minimum=0.0)
    lora_target_modules: list[str] = _f(list(LORA_TARGETS), "projections that get adapters "
                                        "(comma-separated on the command line)", type=list)
    lora_layers: int = _f(8, "adapt only the last N decoder layers (0: all); fewer layers "
                          "means a shorter backward pass", type=int, minimum=0)
    quantization: str = _f("int4", "qlora: how the frozen base is held in memory; with "
                           "quantization_mode post-training: the format the trained artifact "
                           "is quantized to (none: not quantized)", type=str,
                           choices=("int4", "int8", "fp8", "fp4", "none"))
    quantization_mode: str = _f("training", "training: qlora holds its base in `quantization` "
                                "while it trains (other methods ignore it); post-training: the "
                                "trained artifact is quantized at the end (fp8, fp4, int8; none "
                                "skips it) into OUTPUT_DIRECTORY/quantized (typed-lm's key)",
                                type=str, choices=("training", "post-training"))
    quantization_block_size: int = _f(64, "qlora int4: weights per scale", type=int, minimum=8)
    checkpoint_steps: int = _f(0, "also checkpoint every N optimizer steps (0: at epoch ends "
                               "only)", type=int, minimum=0)
    resume: bool = _f(False, "continue from the checkpoint in the output directory", type=bool)
    context_path: str | None = _f(None, "system context rendered into every prompt; serve with "
                                  "the same --context-path", type=str, optional=True)


@dataclass
class ModelGeometry:
    """[model]: explicit geometry for from-scratch (absent keys take the family default)."""

    architecture: str = _f("llama", "model family", type=str, choices=ARCHITECTURES)
    vocab_size: int | None = _f(None, "vocabulary size (default: the tokenizer's)", type=int,
                                optional=True, minimum=1)
    hidden_size: int = _f(256, "hidden size", type=int, minimum=1)
    intermediate_size: int | None = _f(None, "MLP size (default: 4 x hidden size)", type=int,
                                       optional=True, minimum=1)
    num_hidden_layers: int = _f(4, "decoder layers", type=int, minimum=1)
    num_attention_heads: int = _f(4, "attention heads", type=int, minimum=1)
    num_key_value_heads: int | None = _f(None, "key/value heads (default: attention heads)",
                                         type=int, optional=True, minimum=1)
    head_dim: int | None = _f(None, "head size (default: hidden size / heads)", type=int,
                              optional=True, minimum=1)
    max_position_embeddings: int = _f(4096, "longest position", type=int, minimum=1)
    rope_theta: float = _f(10000.0, "RoPE base frequency", type=float, minimum=0.0)
    rms_norm_eps: float = _f(1e-6, "RMSNorm epsilon", type=float, minimum=0.0)
    tie_word_embeddings: bool = _f(True, "share the input embeddings and the output head",
                                   type=bool)
    attention_bias: bool | None = _f(None, "bias on q/k/v/o (default: the family's)", type=bool,
                                     optional=True)
    sliding_window: int | None = _f(None, "sliding attention window (gemma2/gemma3, mistral)",
                                    type=int, optional=True, minimum=1)
    sliding_window_pattern: int | None = _f(None, "gemma3: every Nth layer is global", type=int,
                                            optional=True, minimum=1)
    rope_local_base_frequency: float | None = _f(None, "gemma3: RoPE base of local layers",
                                                 type=float, optional=True, minimum=0.0)
    query_pre_attention_scalar: float | None = _f(None, "gemma2/gemma3: query scale", type=float,
                                                  optional=True, minimum=0.0)
    logit_softcapping: float | None = _f(None, "gemma2: final logit soft-cap", type=float,
                                         optional=True, minimum=0.0)
    attention_logit_softcapping: float | None = _f(None, "gemma2: attention soft-cap",
                                                   type=float, optional=True, minimum=0.0)


@dataclass
class Initialization:
    """[initialization]: from-scratch initializers (TOML only, no flags)."""

    initializer_range: float = _f(0.02, "std of projection weights", type=float, flag=False,
                                  minimum=0.0)
    embedding_std: float = _f(0.02, "std of embeddings (and an untied head)", type=float,
                              flag=False, minimum=0.0)
    norm_weight: float = _f(1.0, "effective RMSNorm scale", type=float, flag=False)
    bias_value: float = _f(0.0, "value of every bias", type=float, flag=False)


@dataclass
class DatasetConfig:
    """[dataset]: training and validation data."""

    path: str | None = _f(None, "training dataset (.jsonl, .json record or array)", type=str,
                          optional=True)
    validation_path: str | None = _f(None, "validation dataset", type=str, optional=True)
    validation_split: float | None = _f(
        None, "hold out this fraction of the training set for validation and for fitting the "
        "adapter's calibration (when no validation dataset is given; default: "
        f"{DEFAULT_VALIDATION_SPLIT} when the set has at least {AUTO_VALIDATION_RECORDS} records, "
        "else none; 0: none)", type=float, minimum=0.0, optional=True)
    option_orders: str = _f("name", "name: each choice's options sorted by name, as debias "
                            "name-order (the default) reads them; declared: in the order the "
                            "record declares them (serve with debias none: the adapter may learn "
                            "the label letters); rotations: each question read in one seeded "
                            "cyclic rotation of its options, as debias rotations reads them (the "
                            "adapter must read the names)", type=str, choices=OPTION_ORDERS)


@dataclass
class TokenizerConfig:
    """[tokenizer]: the tokenizer of a from-scratch model."""

    file: str | None = _f(None, "tokenizer.json or a directory with tokenizer files (default: "
                          "the tokenizer of --model)", type=str, optional=True)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelGeometry = field(default_factory=ModelGeometry)
    initialization: Initialization = field(default_factory=Initialization)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelGeometry,
    "initialization": Initialization,
    "dataset": DatasetConfig,
    "tokenizer": TokenizerConfig,
}

# CLI flag names that differ from "--" + key with dashes (kept short and familiar).
FLAG_NAMES = {
    ("dataset", "path"): "dataset",
    ("dataset", "validation_path"): "validation-dataset",
    ("dataset", "validation_split"): "validation-split",
    ("tokenizer", "file"): "tokenizer",
    ("run", "resume"): "resume",
}
ALIASES = {("run", "model_id"): "model"}  # the reference trainer's spelling


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    flag: str | None  # without the leading dashes
    type: Any
    default: Any
    help: str
    choices: tuple | None
    minimum: float | None
    optional: bool

    @property
    def dest(self) -> str:
        return f"{self.section}__{self.key}"


def settings() -> list[Setting]:
    """Every setting, in section order: the source of the CLI flags and the TOML schema."""
    out = []
    for section, cls in SECTIONS.items():
        instance = cls()
        for f in dataclasses.fields(cls):
            meta = f.metadata
            flag = None
            if meta["flag"]:
                flag = FLAG_NAMES.get((section, f.name), f.name.replace("_", "-"))
            out.append(Setting(section, f.name, flag, meta["type"], getattr(instance, f.name),
                               meta["help"], meta["choices"], meta["minimum"], meta["optional"]))
    return out


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
               list: "an array of strings"}


def _coerce(setting: Setting, value: Any) -> Any:
    """Check ``value`` against the setting's type; raise ValueError with what was expected."""
    kind = setting.type
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
        if ok and not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
    elif kind is str:
        ok = isinstance(value, str)
    elif kind is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:  # pragma: no cover - a programming error in the field table
        raise TypeError(kind)
    if not ok:
        got = repr(value) if isinstance(value, str) else f"{type(value).__name__} {value!r}"
        raise ValueError(f"expected {_TYPE_WORDS[kind]}, got {got}")
    return value


def _check_range(setting: Setting, value: Any) -> None:
    if value is None:
        if not setting.optional:
            raise ValueError("a value is required")
        return
    if setting.choices and value not in setting.choices:
        raise ValueError(f"expected one of {', '.join(setting.choices)}, got {value!r}")
    if setting.minimum is not None and isinstance(value, (int, float)) and value < setting.minimum:
        raise ValueError(f"expected a value >= {setting.minimum:g}, got {value!r}")


def read_toml(path: str | Path) -> dict[tuple[str, str], Any]:
    """Read and type-check a configuration file: {(section, key): value}."""
    path = Path(path)
    prefix = f"configuration file error in '{path}'"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{prefix}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{prefix}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{prefix}: invalid TOML: {exc}") from None
    table = {(s.section, s.key): s for s in settings()}
    values: dict[tuple[str, str], Any] = {}
    for section, body in data.items():
        if not isinstance(body, dict):
            raise ConfigError(
                f"{prefix}: top-level key '{section}'; every key belongs in a section "
                "([run], [model], [initialization], [dataset] or [tokenizer])"
            )
        if section not in SECTIONS:
            raise ConfigError(
                f"{prefix}: unknown section [{section}]; expected one of "
                + ", ".join(f"[{s}]" for s in SECTIONS)
            )
        for key, value in body.items():
            key = ALIASES.get((section, key), key)
            setting = table.get((section, key))
            if setting is None:
                known = ", ".join(k for (s, k) in table if s == section)
                raise ConfigError(
                    f"{prefix}: [{section}] unknown key '{key}'; expected one of {known}"
                )
            try:
                value = _coerce(setting, value)
                _check_range(setting, value)
            except ValueError as exc:
                raise ConfigError(f"{prefix}: [{section}] {key}: {exc}") from None
            values[(section, key)] = value
    return values


def resolve_config(
    flags: Mapping[tuple[str, str], Any] | None = None, toml_path: str | Path | None = None
) -> TrainConfig:
    """Build the effective configuration: flag (not None) > TOML key > default, per key.

    ``flags`` maps (section, key) to the parsed flag value, None when the flag was not given.
    """
    flags = dict(flags or {})
    from_toml = read_toml(toml_path) if toml_path is not None else {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for setting in settings():
        where = (setting.section, setting.key)
        if flags.get(where) is not None:
            value = flags[where]
            try:
                value = _coerce(setting, value)
                _check_range(setting, value)
            except ValueError as exc:
                raise ConfigError(f"--{setting.flag}: {exc}") from None
        elif where in from_toml:
            value = from_toml[where]
        else:
            value = setting.default
        sections[setting.section][setting.key] = value
    config = TrainConfig(**{name: SECTIONS[name](**body) for name, body in sections.items()})
    _check_quantization(config.run)
    adapters = config.run.method in ("lora", "qlora")
    if config.run.learning_rate is None:
        config.run.learning_rate = ADAPTER_LEARNING_RATE if adapters else FULL_LEARNING_RATE
    if config.run.lr_schedule is None:
        config.run.lr_schedule = "constant" if adapters else "linear"
    return config


def _check_quantization(run: RunConfig) -> None:
    """``quantization`` x ``quantization_mode`` x ``method``: what each pair means is fixed, so
    a pair with no meaning is an error, never silently ignored."""
    if run.method == "qlora" and run.quantization_mode == "post-training":
        raise ConfigError("quantization_mode post-training: qlora quantizes its base while it "
                          "trains (quantization_mode training); quantize the merged result "
                          "with `onepass quantize` afterwards")
    if run.method == "qlora" and run.quantization == "none":
        raise ConfigError("quantization none: qlora trains over a quantized base; use int4, "
                          "int8, fp8 or fp4, or --method lora")
    if run.quantization_mode == "post-training" and run.quantization == "int4":
        raise ConfigError("quantization int4 with quantization_mode post-training: a served "
                          "artifact is fp8, fp4 or int8 (or none)")


def validation_split(config: TrainConfig, records: int) -> float:
    """The fraction of ``records`` training records held out (0: none): the configured one,
    else the default for a set of that size; none when a validation dataset is given."""
    if config.dataset.validation_path:
        return 0.0
    if config.dataset.validation_split is not None:
        return config.dataset.validation_split
    return DEFAULT_VALIDATION_SPLIT if records >= AUTO_VALIDATION_RECORDS else 0.0


def check_complete(config: TrainConfig) -> None:
    """The settings a run cannot start without."""
    if not config.dataset.path:
        raise ConfigError("a training dataset is required: --dataset FILE or [dataset] path")
    if not config.run.output_directory:
        raise ConfigError(
            "an output directory is required: --output-directory DIR or [run] output_directory"
        )
    if config.dataset.validation_path and config.dataset.validation_split:
        raise ConfigError("give either a validation dataset or a validation split, not both")
    if (config.dataset.validation_split or 0.0) >= 1.0:
        raise ConfigError("--validation-split: expected a fraction below 1")
    unknown = sorted(set(config.run.lora_target_modules) - set(LORA_TARGETS))
    if unknown or not config.run.lora_target_modules:
        raise ConfigError(
            f"lora_target_modules: expected some of {', '.join(LORA_TARGETS)}, got {unknown}"
        )
