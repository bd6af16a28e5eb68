"""Which models one ``onepass serve`` process keeps resident, and under which names (pure).

From flags (``--model`` repeated, one ``--served-model`` alias each, the other model flags
shared) or from ``--models-config FILE.json``: a non-empty array of objects, one per model,
whose keys override the shared flags for that model. Every name is checked here, before any
model loads, so a typo fails start-up with one line naming the file, the entry and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

TASKS = ("generate", "embedding")
BACKENDS = ("torch", "llamacpp", "remote")
ENGINES = ("sglang", "vllm", "llama-server", "onepass")


class ModelsConfigError(ValueError):
    """A models config or flag combination that cannot be served (one line, names the key)."""


@dataclass(frozen=True)
class ModelSpec:
    """One resident model. ``max_concurrency`` bounds its decision workers and running
    generations; ``default_max_output_tokens`` is its generation limit when a request names
    none. ``task``: ``generate`` (a decoder: decisions, generation, pooled embeddings) or
    ``embedding`` (a sentence encoder: POST /v1/embeddings only). ``backend`` (with
    ``engine`` and ``engine_url`` for ``remote``) says where its decisions are computed, so one
    server can hold a GGUF run by llama.cpp beside a model on a remote engine."""

    model: str | None = None
    served_model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    adapter: str | None = None
    context_path: str | None = None
    max_input_tokens: int = 8192
    max_concurrency: int = 8
    default_max_output_tokens: int = 1024
    task: str = "generate"
    backend: str = "torch"
    engine: str | None = None
    engine_url: str | None = None
    # the remote engine's bearer key; kept out of repr so no log line or error shows it
    engine_api_key: str | None = field(default=None, repr=False)


_CHOICES = {"device": ("auto", "cpu", "cuda", "mps"),
            "dtype": ("auto", "float32", "bfloat16", "float16"),
            "task": TASKS, "backend": BACKENDS}
_POSITIVE = ("max_input_tokens", "max_concurrency", "default_max_output_tokens")
_STRINGS = ("model", "served_model", "adapter", "context_path", "engine_url", "engine_api_key")


def check_spec(spec: ModelSpec, where: str) -> ModelSpec:
    for name, allowed in _CHOICES.items():
        if getattr(spec, name) not in allowed:
            raise ModelsConfigError(f"{where}.{name}: expected one of {', '.join(allowed)}, "
                                    f"got {getattr(spec, name)!r}")
    for name in _POSITIVE:
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelsConfigError(f"{where}.{name}: expected an integer >= 1, got {value!r}")
    for name in _STRINGS:
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ModelsConfigError(f"{where}.{name}: expected a non-empty string")
    if spec.backend == "remote":
        if spec.engine not in ENGINES:
            raise ModelsConfigError(f"{where}.engine: backend remote needs the engine's dialect, "
                                    f"one of {', '.join(ENGINES)}; got {spec.engine!r}")
        if spec.engine_url is None:
            raise ModelsConfigError(f"{where}.engine_url: backend remote needs the engine's "
                                    "base URL")
        if spec.adapter is not None:  # it would be recorded as applied, and silently not be
            raise ModelsConfigError(f"{where}.adapter: backend remote serves the engine's own "
                                    "weights and cannot apply an adapter (merge it with "
                                    "onepass merge and serve the merged checkpoint there)")
    if spec.task == "embedding":  # a sentence encoder: no prompt, no adapter, float32
        if spec.model is None:
            raise ModelsConfigError(f"{where}: task embedding needs the model to load "
                                    "(all-minilm-l6-v2 or a checkpoint directory)")
        for name in ("adapter", "context_path"):
            if getattr(spec, name) is not None:
                raise ModelsConfigError(f"{where}.{name}: an embedding model (task embedding) "
                                        f"takes no {name}")
        if spec.backend != "torch":
            raise ModelsConfigError(f"{where}.backend: an embedding model (task embedding) runs "
                                    f"in process (torch), got {spec.backend!r}")
        if spec.dtype not in ("auto", "float32"):
            raise ModelsConfigError(f"{where}.dtype: an embedding model (task embedding) runs "
                                    f"in float32, got {spec.dtype!r}")
    return spec


def load_models_config(path: str | Path, base: ModelSpec) -> list[ModelSpec]:
    """The entries of ``path`` on top of ``base`` (the shared flags)."""
    where = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelsConfigError(f"{where}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ModelsConfigError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, list) or not raw:
        raise ModelsConfigError(f"{where}: expected a non-empty JSON array of model entries")
    known = {f.name for f in fields(ModelSpec)}
    specs = []
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ModelsConfigError(f"{at}: expected an object with at least 'model'")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ModelsConfigError(f"{at}: unknown key {unknown[0]!r}; expected some of "
                                    f"{', '.join(sorted(known))}")
        if not isinstance(entry.get("model"), str):
            raise ModelsConfigError(f"{at}.model: expected the model to load (a string)")
        specs.append(check_spec(replace(base, **entry), at))
    return check_names(specs, where)


def specs_from_flags(models: list[str] | None, served: list[str] | None,
                     base: ModelSpec) -> list[ModelSpec]:
    """``--model A --model B --served-model a --served-model b``: one spec per model."""
    models = models or [base.model]  # type: ignore[list-item]
    served = served or []
    if len(served) > len(models):
        raise ModelsConfigError(f"--served-model: {len(served)} aliases for {len(models)} "
                                "models; give at most one --served-model per --model")
    specs = [check_spec(replace(base, model=m, served_model=s), "--model")
             for m, s in zip(models, served + [base.served_model] * (len(models) - len(served)))]
    return check_names(specs, "--served-model")


def check_names(specs: list[ModelSpec], where: str) -> list[ModelSpec]:
    """Served names must be unique (the model's own name counts when no alias is given)."""
    if len(specs) > 1:
        seen: dict[str, int] = {}
        for i, spec in enumerate(specs):
            name = spec.served_model or spec.model or "default"
            if name in seen:
                raise ModelsConfigError(
                    f"{where}: models {seen[name]} and {i} are both served as {name!r}; give "
                    "each a distinct served name"
                )
            seen[name] = i
    return specs


def describe(spec: ModelSpec) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(ModelSpec)}
