"""Quantized checkpoint directories: what ``onepass quantize`` writes and the loader reads.

``OUT/`` holds ``model.safetensors``, ``quantization_config.json`` and the base's
``config.json``, ``generation_config.json`` and tokenizer files, so ``onepass serve --model OUT``
needs nothing else. Every linear layer of the decoder stack is quantized; the token embeddings
and the output head (on tied models the same table) are stored with the embedding codec
(bfloat16 by default, ``int8`` per row: a fifth of a small model), the norms and biases in
high precision.

Tensor layout for a decoder linear ``N`` (``N.weight`` in the base; ``N.bias`` unchanged):

=======  ================  =================================  ================================
scheme   ``N.weight``      ``N.weight_scale``                 ``N.weight_shape``
=======  ================  =================================  ================================
fp8      F8_E4M3 [out,in]  F32 [out] (per output channel)     --
int8     I8 [out,in]       F32 [out] (per output channel)     --
fp4      U8 flat, E2M1     U8 [out, ceil(in/32)], E8M0        I64 [2] = (out, in)
         pairs, row-major  (one exponent per 32 weights)
         over the row
         zero-padded to a
         multiple of 32;
         element 2i in the
         low nibble
=======  ================  =================================  ================================

An fp4 artifact may keep a few layers at fp8 (``layer_schemes`` in the config: name -> scheme);
those layers have the fp8 layout above.

Decoding: fp8 ``w = e4m3 * scale[o]``; int8 ``w = q * scale[o]``; fp4
``w = e2m1 * 2**(scale[o, i // 32] - 127)``. An int8 embedding ``E.weight`` is I8 [rows, dim]
with ``E.weight_scale`` F32 [rows]; a bfloat16 / float32 one is the plain table.

At load the decoder linears become *working weights* (``compute``): ``int8`` (int8 matmuls
on VNNI, activations quantized per token), the model's float dtype (decoded once), or
``stored`` (kept in the file's format and decoded on every forward: the least memory, the
slowest).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from onepass.quant.formats import (
    EMBEDDING_CODECS,
    Codec,
    Fp8Codec,
    Int8Codec,
    Mxfp4Codec,
    Tensors,
    codec_for,
    decode_embedding,
    encode_embedding,
)
from onepass.quant.linear import (
    Int8Linear,
    QuantizedLinear,
    decoder_linears,
    replace_module,
    to_working_weights,
)
from onepass.quant.table import install_stored_tables

QUANT_CONFIG = "quantization_config.json"
WEIGHTS = "model.safetensors"
FORMAT = "onepass-quantized"
SCHEMES = ("none", "fp8", "fp4", "int8")
COMPUTES = ("auto", "int8", "fp8", "stored", "float32", "bfloat16", "float16")
WEIGHT_DESCRIPTIONS = {
    "fp8": "float8 E4M3, one float32 scale per output channel",
    "fp4": "MXFP4: E2M1 pairs per byte (low nibble first), one E8M0 exponent per 32 input "
           "weights",
    "int8": "int8, one float32 scale per output channel (symmetric)",
}


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


def cpu_has_int8_dot() -> bool:
    """Whether the CPU has int8 dot-product units (VNNI / AMX-INT8) for the int8 kernel."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is None:
        return False
    found = capabilities()
    return any(found.get(k) for k in ("avx512_vnni", "avx_vnni", "amx_int8"))


def resolve_compute(compute: str, device: torch.device) -> str:
    """``auto`` -> the model's float dtype, decoded once (``float``): the artifact's answers at
    bfloat16 speed. Not ``int8``: it quantizes the activations too, and on the embedded model
    that moves answers more than the stored weights do (probe agreement 0.96 / mean TV 0.030
    for smoothed int8 compute, 0.97 / 0.021 for int8 weights alone). Float dtype names ->
    ``float``; ``int8`` is refused off the CPU (the kernel is a CPU one)."""
    if compute not in COMPUTES:
        raise QuantizeError(f"compute: expected one of {', '.join(COMPUTES)}, got {compute!r}")
    if compute == "auto":
        return "float"
    if compute == "int8" and (device.type != "cpu" or not cpu_has_int8_dot()):
        raise QuantizeError(f"compute int8 needs a CPU with int8 dot-product units (VNNI), "
                            f"not {device.type}: choose bfloat16 or stored")
    if compute == "fp8" and not gpu_has_fp8(device):
        raise QuantizeError("compute fp8 needs a GPU with fp8 units (CUDA compute capability "
                            f"8.9+: Ada, Hopper, Blackwell), not {_device_words(device)}: "
                            "choose int8 (a CPU with VNNI), bfloat16 or stored")
    return compute if compute in ("int8", "fp8", "stored") else "float"


def default_embedding(scheme: str) -> str:
    """The table codec ``--embedding auto`` picks: int8 per row where the scheme is about
    memory (fp8, fp4: it brings them to 0.25x / 0.16x of float32 at the same mean TV),
    bfloat16 for the int8 scheme, which is about near-float answers at int8 speed (an int8
    table moved its probe agreement from 0.97 to 0.95)."""
    return "bfloat16" if scheme == "int8" else "int8"


def gpu_has_fp8(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA GPU whose tensor cores multiply fp8 (``torch._scaled_mm``)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _device_words(device: torch.device) -> str:
    if device.type != "cuda":
        return f"a {device.type} device"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (capability {major}.{minor})"


def _embedding_names(model: Any) -> set[str]:
    """State-dict names of the token embedding and the output head weights."""
    names = set()
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is None:
            continue
        for name, candidate in model.named_modules():
            if candidate is module:
                names.add(f"{name}.weight")
    return names


def _stored_tensors(codec: Codec, name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    encoded = codec.encode(weight)
    if isinstance(codec, Fp8Codec):
        return {name: encoded["qweight"].view(torch.float8_e4m3fn),
                f"{name}_scale": encoded["scale"]}
    if isinstance(codec, Int8Codec):
        return {name: encoded["qweight"], f"{name}_scale": encoded["scale"].reshape(-1)}
    return {name: encoded["qweight"].flatten(), f"{name}_scale": encoded["scale"],
            f"{name}_shape": torch.tensor(weight.shape, dtype=torch.int64)}


def _sizes(state: dict[str, torch.Tensor], linears: set[str], tables: set[str]) -> dict[str, int]:
    """Tensor bytes in the file by part: decoder linears, embedding / head, the rest."""
    sizes = {"quantized_layers": 0, "embedding": 0, "high_precision": 0}
    for name, tensor in state.items():
        module = name.rpartition(".")[0]
        base = name.removesuffix("_scale").removesuffix("_shape")
        part = ("quantized_layers" if module in linears and ".weight" in name[len(module):]
                else "embedding" if base in tables else "high_precision")
        sizes[part] += tensor.numel() * tensor.element_size()
    return {**sizes, "total": sum(sizes.values())}


def write_quantized(
    model: Any,
    tokenizer: Any,
    directory: str | Path,
    scheme: str,
    *,
    dtype: torch.dtype = torch.float32,
    embedding: str = "auto",
    compute: str = "auto",
    provenance: dict[str, Any] | None = None,
    progress: Callable[[], None] | None = None,
    layer_schemes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write ``model`` with its decoder linears in ``scheme`` (fp8, fp4 or int8), the token
    embedding / output head with the ``embedding`` codec; returns the
    ``quantization_config.json`` it wrote (``compute``: the working weights a load picks unless
    told otherwise). ``layer_schemes``: decoder linears written in another scheme (the few
    sensitive layers of an fp4 model kept at fp8), recorded by name in the config. Files appear
    atomically, one by one."""
    from safetensors.torch import save_file

    codec = codec_for(scheme)
    layer_schemes = dict(layer_schemes or {})
    if embedding == "auto":
        embedding = default_embedding(scheme)
    if embedding not in EMBEDDING_CODECS:
        raise QuantizeError(f"embedding: expected one of {', '.join(EMBEDDING_CODECS)}, got "
                            f"{embedding!r}")
    if compute not in COMPUTES:
        raise QuantizeError(f"compute: expected one of {', '.join(COMPUTES)}, got {compute!r}")
    linears = {name for name, _ in decoder_linears(model)}
    for name, other in layer_schemes.items():
        if name not in linears:
            raise QuantizeError(f"layer_schemes: {name!r} is not a decoder linear")
        if other not in WEIGHT_DESCRIPTIONS:
            raise QuantizeError(f"layer_schemes: {name}: expected one of "
                                f"{', '.join(WEIGHT_DESCRIPTIONS)}, got {other!r}")
    layer_schemes = {n: s for n, s in layer_schemes.items() if s != scheme}
    tables = _embedding_names(model)
    state: dict[str, torch.Tensor] = {}
    kept: list[str] = []
    stored_tables: list[str] = []
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen:  # a tied copy (the output head of a tied model)
            continue
        seen.add(storage)
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module in linears:
            own = codec_for(layer_schemes[module]) if module in layer_schemes else codec
            state.update(_stored_tensors(own, name, tensor))
            if progress is not None:
                progress()
        elif name in tables:
            state.update({f"{name}{suffix}": t for suffix, t in
                          encode_embedding(embedding, tensor).items()})
            stored_tables.append(name)
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
        "weights": WEIGHT_DESCRIPTIONS[scheme],
        "quantized_layers": sorted(linears),
        **({"layer_schemes": dict(sorted(layer_schemes.items()))} if layer_schemes else {}),
        "embedding": {"codec": embedding, "tensors": sorted(stored_tables)},
        "compute": compute,
        "bytes": _sizes(state, linears, set(stored_tables)),
        "high_precision": {"dtype": str(dtype).removeprefix("torch."), "tensors": kept},
        "tied_output_head": bool(getattr(model.config, "tie_word_embeddings", False)),
        **(provenance or {}),
    }
    tmp = directory / (QUANT_CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, directory / QUANT_CONFIG)
    return config


def load_quantized(
    path: str | Path, config: dict[str, Any], *, dtype: torch.dtype, attn: str,
    compute: str = "stored",
) -> Any:
    """Build the model straight from the file, its decoder linears as ``compute`` working
    weights (``stored``: :class:`QuantizedLinear`, ``int8``: :class:`Int8Linear`, ``float``:
    decoded once into ``dtype``), one layer at a time (never the whole float model)."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    default = codec_for(config["scheme"])
    layer_schemes = config.get("layer_schemes") or {}
    if not isinstance(layer_schemes, dict) or any(
            v not in WEIGHT_DESCRIPTIONS for v in layer_schemes.values()):
        raise QuantizeError(f"{path / QUANT_CONFIG}: 'layer_schemes' must map layer names to "
                            f"one of {', '.join(WEIGHT_DESCRIPTIONS)}")
    with init_empty_weights(include_buffers=False):  # parameters on "meta", buffers real
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(path), dtype=dtype, attn_implementation=attn
        )
    tensors = load_file(str(path / WEIGHTS))
    names = {name for name, _ in decoder_linears(model)}
    if set(layer_schemes) - names:
        raise QuantizeError(f"{path / QUANT_CONFIG}: 'layer_schemes' names "
                            f"{sorted(set(layer_schemes) - names)[:3]}, not decoder linears")
    for name, linear in decoder_linears(model):
        codec = codec_for(layer_schemes[name]) if name in layer_schemes else default
        shaped = not isinstance(codec, (Fp8Codec, Int8Codec))
        key = f"{name}.weight"
        needed = [key, f"{key}_scale"] + ([f"{key}_shape"] if shaped else [])
        if any(k not in tensors for k in needed):
            raise QuantizeError(f"{path / WEIGHTS}: no quantized {key} (needs "
                                f"{', '.join(needed)}): the file does not match its config.json")
        stored, scale = tensors.pop(key), tensors.pop(f"{key}_scale")
        shape = (linear.out_features, linear.in_features)
        if isinstance(codec, Fp8Codec):
            found, qweight = tuple(stored.shape), stored.view(torch.uint8)
        elif isinstance(codec, Int8Codec):
            found, qweight = tuple(stored.shape), stored
        else:
            found, qweight = tuple(tensors.pop(f"{key}_shape").tolist()), stored.view(shape[0], -1)
        if found != shape:
            raise QuantizeError(f"{path / WEIGHTS}: {key} is {found}, config.json says {shape}")
        bias = tensors.pop(f"{name}.bias", None)
        bias = None if bias is None else bias.to(dtype)
        if isinstance(codec, Int8Codec) and compute != "float":
            layer: torch.nn.Module = Int8Linear(qweight, scale, bias)
        else:
            layer = QuantizedLinear(codec, linear.in_features, linear.out_features,
                                    {"qweight": qweight, "scale": scale[:, None]
                                     if isinstance(codec, Int8Codec) else scale}, bias)
        replace_module(model, name, layer)
        if compute in ("int8", "fp8", "float"):  # one layer decoded at a time
            to_working_weights(model, compute, dtype, only=name)
    embedding = config.get("embedding") or {}
    kept: dict[str, Tensors] = {}  # under `stored` the tables stay in their codec
    for name in embedding.get("tensors", []):
        scale = tensors.pop(f"{name}_scale", None)
        if name not in tensors:
            raise QuantizeError(f"{path / WEIGHTS}: no {name}: the file does not match its "
                                "config.json")
        stored = {"weight": tensors.pop(name)} | ({} if scale is None else {"scale": scale})
        if compute == "stored":
            kept[name] = stored
        else:
            tensors[name] = decode_embedding(embedding["codec"], stored, dtype)
    if kept:
        install_stored_tables(model, embedding["codec"], kept, dtype)
    _, unexpected = model.load_state_dict(
        {name: tensor.to(dtype) for name, tensor in tensors.items()}, strict=False, assign=True
    )
    if not kept:
        model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing or unexpected:
        raise QuantizeError(f"{path / WEIGHTS}: missing {missing[:5]}, unexpected "
                            f"{list(unexpected)[:5]}: the file does not match its config.json")
    return model
