"""Load a LoRA adapter written by ``onepass train`` and merge it into a base model.

Serving-side and training-free: this module imports neither peft nor anything in
``onepass.train``. An adapter directory holds::

    adapter.safetensors   <module path>.lora_a [rank, in] and .lora_b [out, rank] per target
    adapter_config.json   {"format": "onepass-lora", "rank", "alpha", "base", "architecture",
                           "prompt_version", "target_modules", "method", ...}

Merging sets ``W <- W + (alpha / rank) * lora_b @ lora_a`` on every targeted linear layer
(computed in float32, stored in the layer's dtype), so the merged model runs at the base
model's speed. A peft-format directory (``adapter_model.safetensors``) is merged through peft.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from onepass.option_order import ADAPTER_CONFIG
from onepass.prompt import PROMPT_VERSION

ADAPTER_WEIGHTS = "adapter.safetensors"

log = logging.getLogger("onepass.adapters")


class AdapterError(ValueError):
    """An adapter that cannot be applied to this base, and why."""


def is_onepass_adapter(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_WEIGHTS).is_file()


def read_adapter(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The adapter's config and its tensors (float32, CPU)."""
    from safetensors.torch import load_file

    path = Path(path)
    config_path = path / ADAPTER_CONFIG
    if not (path / ADAPTER_WEIGHTS).is_file() or not config_path.is_file():
        raise AdapterError(
            f"{path}: not an adapter directory (expected {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG})"
        )
    config = json.loads(config_path.read_text())
    for key in ("rank", "alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise AdapterError(f"{config_path}: '{key}' must be a positive number")
    return config, load_file(str(path / ADAPTER_WEIGHTS))


def adapter_deltas(
    config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Module path -> the float32 weight delta ``scale * B @ A`` it adds."""
    scale = float(config["alpha"]) / float(config["rank"])
    modules = sorted({name.rsplit(".", 1)[0] for name in tensors})
    deltas = {}
    for module in modules:
        a, b = tensors.get(f"{module}.lora_a"), tensors.get(f"{module}.lora_b")
        if a is None or b is None:
            raise AdapterError(f"{module}: needs both .lora_a and .lora_b")
        if a.shape[0] != b.shape[1]:
            raise AdapterError(f"{module}: lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} "
                               "disagree on the rank")
        deltas[module] = scale * (b.float() @ a.float())
    return deltas


@torch.no_grad()
def merge_adapter(model: Any, path: str | Path) -> Any:
    """Merge the onepass adapter at ``path`` into ``model`` in place; returns the model."""
    config, tensors = read_adapter(path)
    family = getattr(model.config, "model_type", None)
    expected = config.get("architecture")
    if expected and family and expected.replace("_text", "") != family.replace("_text", ""):
        raise AdapterError(
            f"{path}: the adapter was trained on a {expected} model; this base is {family}"
        )
    if config.get("prompt_version") not in (None, PROMPT_VERSION):
        log.warning(
            "adapter %s was trained with prompt %s; this engine renders %s: answers may differ",
            path, config.get("prompt_version"), PROMPT_VERSION,
        )
    modules = dict(model.named_modules())
    for name, delta in adapter_deltas(config, tensors).items():
        module = modules.get(name)
        weight = getattr(module, "weight", None)
        if weight is None:
            raise AdapterError(f"{path}: the base has no linear layer named {name}")
        if tuple(weight.shape) != tuple(delta.shape):
            raise AdapterError(
                f"{path}: {name} is {tuple(weight.shape)} in the base but the adapter expects "
                f"{tuple(delta.shape)}: a different base model?"
            )
        weight.add_(delta.to(device=weight.device, dtype=weight.dtype))
    return model


def apply_adapter(model: Any, path: str | Path) -> Any:
    """Merge an adapter directory (onepass or peft format) into ``model``; returns the model."""
    path = Path(path)
    if is_onepass_adapter(path):
        return merge_adapter(model, path)
    if (path / "adapter_model.safetensors").is_file() or (path / "adapter_model.bin").is_file():
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise AdapterError(f"{path}: a peft-format adapter needs peft: pip install "
                               "'onepass[train]' (onepass train's adapter.safetensors loads "
                               "without it)") from exc

        return PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    raise AdapterError(
        f"{path}: not an adapter directory (expected {ADAPTER_WEIGHTS} + {ADAPTER_CONFIG} "
        "from onepass train, or a peft adapter_model.safetensors)"
    )
