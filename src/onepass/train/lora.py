"""LoRA adapters (peft) for the lora and qlora methods, and their export.

Training uses peft's LoRA layers over the frozen base (or over :class:`QuantizedLinear`
layers for qlora, registered with peft as a custom module). The artifact is written in
onepass's own small format, read back by :mod:`onepass.adapters` without peft or training
code::

    adapter.safetensors   <module path>.lora_a [rank, in], <module path>.lora_b [out, rank]
    adapter_config.json   rank, alpha, base, architecture, prompt version, target modules

where ``<module path>`` is the module's name in the base model (``model.layers.3.self_attn
.q_proj``), and the merged weight is ``W + (alpha / rank) * lora_b @ lora_a``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch

_PEFT_NAME = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])\.default\.weight$")


def apply_lora(
    model: Any,
    *,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str],
    last_layers: int = 0,
    seed: int = 0,
) -> Any:
    """Wrap ``model`` with LoRA adapters; only the adapters are trainable.

    ``last_layers`` > 0 adapts only the last N decoder layers, so the backward pass stops
    there (the frozen layers below run forward only).
    """
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError as exc:
        from onepass.train.config import ConfigError

        raise ConfigError("method: lora and qlora train with peft, which is not installed: "
                          "pip install 'onepass[train]'") from exc

    from onepass.quant.linear import QuantizedLinear

    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    layers = None
    if last_layers and last_layers < n_layers:
        layers = list(range(n_layers - last_layers, n_layers))
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        layers_to_transform=layers,
        bias="none",
    )
    config._register_custom_module({QuantizedLinear: LoraLinear})
    torch.manual_seed(seed)  # the A matrices' initialization
    with warnings.catch_warnings():
        # peft warns about the custom QuantizedLinear it was told to wrap, and transformers
        # about a deprecated attribute peft reads: neither is actionable here.
        warnings.filterwarnings("ignore", message="Unsupported layer type")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(model, config)


def adapter_tensors(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter in onepass's tensor names, float32, contiguous, on the CPU."""
    out: dict[str, torch.Tensor] = {}
    for name, param in peft_model.named_parameters():
        match = _PEFT_NAME.match(name)
        if match is None:
            continue
        module, which = match.groups()
        out[f"{module}.lora_{which.lower()}"] = param.detach().float().cpu().contiguous()
    if not out:
        raise ValueError("the model has no LoRA parameters to export")
    return out


def load_adapter_tensors(peft_model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Put exported adapter tensors back into a peft model (resume)."""
    params = dict(peft_model.named_parameters())
    for name, param in params.items():
        match = _PEFT_NAME.match(name)
        if match is None:
            continue
        module, which = match.groups()
        with torch.no_grad():
            param.copy_(tensors[f"{module}.lora_{which.lower()}"].to(param.dtype))
