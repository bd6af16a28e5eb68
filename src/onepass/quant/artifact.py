"""Quantized checkpoint directories: what ``onepass quantize`` writes and the loader reads.

``OUT/`` holds ``model.safetensors``, ``quantization_config.json`` and the base's
``config.json``, ``generation_config.json`` and tokenizer files, so ``onepass serve --model OUT``
needs nothing else. Every linear layer of the decoder stack is quantized; the token embeddings,
the norms and the output head stay in high precision (the head's candidate rows *are* the
decision logits, and on tied models the head is the embedding table).

Tensor layout for a decoder linear ``N`` (``N.weight`` in the base; ``N.bias`` unchanged):

=======  ================  =================================  ================================
scheme   ``N.weight``      ``N.weight_scale``                 ``N.weight_shape``
=======  ================  =================================  ================================
fp8      F8_E4M3 [out,in]  F32 [out] (per output channel)     --
fp4      U8 flat, E2M1     U8 [out, ceil(in/32)], E8M0        I64 [2] = (out, in)
         pairs, row-major  (one exponent per 32 weights)
         over the row
         zero-padded to a
         multiple of 32;
         element 2i in the
         low nibble
=======  ================  =================================  ================================

Decoding: fp8 ``w = e4m3 * scale[o]``; fp4 ``w = e2m1 * 2**(scale[o, i // 32] - 127)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from onepass.quant.formats import Codec, Fp8Codec, Mxfp4Codec, codec_for
from onepass.quant.linear import QuantizedLinear, decoder_linears, replace_module

QUANT_CONFIG = "quantization_config.json"
WEIGHTS = "model.safetensors"
FORMAT = "onepass-quantized"
SCHEMES = ("none", "fp8", "fp4")


class QuantizeError(ValueError):
    """A checkpoint that cannot be quantized or loaded as quantized, and why."""


def read_quantization(path: str | Path) -> dict[str, Any] | None:
    """The directory's ``quantization_config.json`` if it describes quantized weights."""
    config_path = Path(path) / QUANT_CONFIG
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise QuantizeError(f"{config_path}: not valid JSON ({exc})") from exc
    scheme = config.get("scheme") if isinstance(config, dict) else None
    if scheme not in SCHEMES + ("mxfp4",):
        raise QuantizeError(f"{config_path}: 'scheme' must be one of {', '.join(SCHEMES)}, "
                            f"got {scheme!r}")
    return None if scheme == "none" else config


def refuse_quantized_input(path: str | Path) -> None:
    """Quantizing twice compounds the error: refuse an already quantized checkpoint."""
    ours = read_quantization(path)
    if ours is not None:
        raise QuantizeError(f"{path} is already quantized ({ours['scheme']}); quantize the "
                            "original checkpoint instead")
    config = json.loads((Path(path) / "config.json").read_text())
    theirs = config.get("quantization_config")
    if theirs:
        method = theirs.get("quant_method", "unknown") if isinstance(theirs, dict) else theirs
        raise QuantizeError(f"{path} is already quantized ({method}); quantize a full-precision "
                            "checkpoint instead")


def _stored_tensors(codec: Codec, name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    encoded = codec.encode(weight)
    if isinstance(codec, Fp8Codec):
        return {name: encoded["qweight"].view(torch.float8_e4m3fn),
                f"{name}_scale": encoded["scale"]}
    return {name: encoded["qweight"].flatten(), f"{name}_scale": encoded["scale"],
            f"{name}_shape": torch.tensor(weight.shape, dtype=torch.int64)}


def write_quantized(
    model: Any,
    tokenizer: Any,
    directory: str | Path,
    scheme: str,
    *,
    dtype: torch.dtype = torch.float32,
    provenance: dict[str, Any] | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Write ``model`` with its decoder linears in ``scheme`` (fp8 or fp4); returns the
    ``quantization_config.json`` it wrote. Files appear atomically, one by one."""
    from safetensors.torch import save_file

    codec = codec_for(scheme)
    linears = {name for name, _ in decoder_linears(model)}
    state: dict[str, torch.Tensor] = {}
    kept: list[str] = []
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen:  # a tied copy (the output head of a tied model)
            continue
        seen.add(storage)
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module in linears:
            state.update(_stored_tensors(codec, name, tensor))
            if progress is not None:
                progress()
        else:
            state[name] = tensor.detach().to(dtype).contiguous()
            kept.append(name)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "quantization": scheme})
    tmp.chmod(0o644)
    os.replace(tmp, directory / WEIGHTS)
    model.config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    config = {
        "format": FORMAT,
        "scheme": scheme,
        "block_size": Mxfp4Codec.block_size if scheme == "fp4" else None,
        "weights": ("float8 E4M3, one float32 scale per output channel" if scheme == "fp8" else
                    "MXFP4: E2M1 pairs per byte (low nibble first), one E8M0 exponent per "
                    "32 input weights"),
        "quantized_layers": sorted(linears),
        "high_precision": {"dtype": str(dtype).removeprefix("torch."), "tensors": kept},
        "tied_output_head": bool(getattr(model.config, "tie_word_embeddings", False)),
        **(provenance or {}),
    }
    tmp = directory / (QUANT_CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, directory / QUANT_CONFIG)
    return config


def load_quantized(
    path: str | Path, config: dict[str, Any], *, dtype: torch.dtype, attn: str
) -> Any:
    """Build the model with :class:`QuantizedLinear` decoder layers straight from the file:
    float weights of those layers are never materialised."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    codec = codec_for(config["scheme"])
    with init_empty_weights(include_buffers=False):  # parameters on "meta", buffers real
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(path), dtype=dtype, attn_implementation=attn
        )
    tensors = load_file(str(path / WEIGHTS))
    for name, linear in decoder_linears(model):
        key = f"{name}.weight"
        needed = [key, f"{key}_scale"] + ([] if isinstance(codec, Fp8Codec) else [f"{key}_shape"])
        if any(k not in tensors for k in needed):
            raise QuantizeError(f"{path / WEIGHTS}: no quantized {key} (needs "
                                f"{', '.join(needed)}): the file does not match its config.json")
        stored, scale = tensors.pop(key), tensors.pop(f"{key}_scale")
        shape = (linear.out_features, linear.in_features)
        if isinstance(codec, Fp8Codec):
            found, qweight = tuple(stored.shape), stored.view(torch.uint8)
        else:
            found, qweight = tuple(tensors.pop(f"{key}_shape").tolist()), stored.view(shape[0], -1)
        if found != shape:
            raise QuantizeError(f"{path / WEIGHTS}: {key} is {found}, config.json says {shape}")
        bias = tensors.pop(f"{name}.bias", None)
        replace_module(model, name, QuantizedLinear(
            codec, linear.in_features, linear.out_features, {"qweight": qweight, "scale": scale},
            None if bias is None else bias.to(dtype)))
    _, unexpected = model.load_state_dict(
        {name: tensor.to(dtype) for name, tensor in tensors.items()}, strict=False, assign=True
    )
    model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing or unexpected:
        raise QuantizeError(f"{path / WEIGHTS}: missing {missing[:5]}, unexpected "
                            f"{list(unexpected)[:5]}: the file does not match its config.json")
    return model
