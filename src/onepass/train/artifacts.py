"""What a training run writes, and the resumable checkpoint it keeps.

``lora`` / ``qlora`` -> ``adapter.safetensors`` + ``adapter_config.json`` (see
:mod:`onepass.adapters`); serve with ``onepass serve --model BASE --adapter DIR`` or write a
merged checkpoint with ``onepass merge``.

``full`` / ``from-scratch`` -> a complete checkpoint: ``model.safetensors`` (canonical Hugging
Face tensor names), ``config.json``, the tokenizer files; serve it with ``--model DIR``.

Every run also writes ``training_summary.json`` (configuration, per-epoch metrics) and keeps
``checkpoint/`` (trainable tensors, optimizer and scheduler state, progress) for ``--resume``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from onepass.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from onepass.calibration import BUNDLED as BUNDLED_CALIBRATION
from onepass.option_order import ADAPTER_FORMAT, SUMMARY
from onepass.train.config import ConfigError

CHECKPOINT_DIR = "checkpoint"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_adapter(
    directory: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]
) -> Path:
    """``adapter.safetensors`` + ``adapter_config.json`` (written atomically, file by file)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (ADAPTER_WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": ADAPTER_FORMAT})
    tmp.chmod(0o666 & ~_umask())
    os.replace(tmp, directory / ADAPTER_WEIGHTS)
    _write_json(directory / ADAPTER_CONFIG, {"format": ADAPTER_FORMAT, **config})
    return directory


def write_checkpoint(directory: str | Path, model: Any, tokenizer: Any) -> Path:
    """A complete servable checkpoint: model.safetensors, config.json, tokenizer files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".staging-"))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        mode = 0o666 & ~_umask()
        for item in staging.iterdir():
            target = directory / item.name
            if target.is_dir():
                shutil.rmtree(target)
            if item.is_file():
                item.chmod(mode)
            os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def write_calibration(directory: str | Path, calibration: dict[str, Any] | None) -> None:
    """The artifact's own ``calibration.json`` (``None``: remove a stale one)."""
    path = Path(directory) / BUNDLED_CALIBRATION
    if calibration is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, calibration)


def write_summary(directory: str | Path, summary: dict[str, Any]) -> None:
    _write_json(Path(directory) / SUMMARY, summary)


# --------------------------------------------------------------------------- resume


def save_training_state(
    directory: str | Path,
    trainable: dict[str, torch.Tensor],
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
) -> None:
    """Everything ``--resume`` needs, replaced as a whole (never half-written)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / CHECKPOINT_DIR
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".checkpoint-"))
    try:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in trainable.items()},
            str(staging / "trainable.safetensors"),
        )
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            staging / "optimizer.pt",
        )
        _write_json(staging / "state.json", state)
        old = directory / (CHECKPOINT_DIR + ".old")
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_training_state(
    directory: str | Path,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]] | None:
    """(trainable tensors, optimizer bundle, state) from ``directory/checkpoint``, or None.

    The bundle is loaded weights-only; one holding anything else is a :class:`ConfigError`.
    """
    from safetensors.torch import load_file

    target = Path(directory) / CHECKPOINT_DIR
    if not (target / "state.json").is_file():
        return None
    tensors = load_file(str(target / "trainable.safetensors"))
    bundle_path = target / "optimizer.pt"
    try:
        # Tensors and plain values only: a checkpoint from elsewhere must not run code.
        bundle = torch.load(bundle_path, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(
            f"--resume: {bundle_path} holds objects other than tensors and plain values "
            f"(loading it could run code), so it is refused; delete {target} to start over "
            "or use a new output directory"
        ) from None
    state = json.loads((target / "state.json").read_text())
    return tensors, bundle, state
