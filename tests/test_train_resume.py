"""Resuming from the last checkpoint continues the run exactly; early stopping and the best
epoch follow validation loss."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file
from train_support import RECORDS, single_thread, tiny_base, write_dataset

from onepass.train import artifacts
from onepass.train.config import ConfigError, resolve_config
from onepass.train.loop import schedule, train

one_thread = pytest.fixture(scope="module", autouse=True)(single_thread)


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_base(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data") / "train.jsonl", RECORDS[:4])


def config(base, dataset, out, **run):
    flags = {("run", "method"): "lora", ("run", "model"): str(base),
             ("run", "output_directory"): str(out), ("dataset", "path"): str(dataset),
             ("run", "epochs"): 2, ("run", "batch_size"): 2, ("run", "learning_rate"): 1e-2,
             ("run", "warmup_steps"): 1, ("run", "lora_rank"): 2, ("run", "lora_alpha"): 4.0}
    flags.update({("run", k): v for k, v in run.items()})
    return resolve_config(flags)


def adapter(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / "adapter.safetensors"))


def test_resume_mid_epoch_reproduces_the_uninterrupted_run(base, dataset, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train(config(base, dataset, straight), show_progress=False)

    resumed = tmp_path / "resumed"
    real_save = artifacts.save_training_state
    calls = []

    def crash_after_third_checkpoint(*args, **kwargs):
        real_save(*args, **kwargs)
        calls.append(1)
        if len(calls) == 3:  # step 3 of 12: in the middle of the first epoch (6 steps)
            raise Interrupted

    monkeypatch.setattr(artifacts, "save_training_state", crash_after_third_checkpoint)
    with pytest.raises(Interrupted):
        train(config(base, dataset, resumed, checkpoint_steps=1), show_progress=False)
    monkeypatch.setattr(artifacts, "save_training_state", real_save)
    state = json.loads((resumed / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and state["epoch"] == 0 and state["micro_batch"] == 3

    result = train(config(base, dataset, resumed, checkpoint_steps=1, resume=True),
                   show_progress=False)
    assert result.optimizer_steps == 12
    a, b = adapter(straight), adapter(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6), name
    # Both epochs' reported losses: epoch 1 was interrupted at step 3 and finished after resume.
    straight_summary = json.loads((straight / "training_summary.json").read_text())
    resumed_summary = json.loads((resumed / "training_summary.json").read_text())
    expected = [h["train_loss"] for h in straight_summary["history"]]
    assert len(expected) == 2
    assert [h["train_loss"] for h in result.history] == pytest.approx(expected, abs=1e-6)
    assert [h["train_loss"] for h in resumed_summary["history"]] == pytest.approx(
        expected, abs=1e-6)


class RunsCode:
    """Unpickling this creates ``path``: what a hostile checkpoint could do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_resume_refuses_a_bundle_that_would_run_code(base, dataset, tmp_path):
    out = tmp_path / "o"
    train(config(base, dataset, out, epochs=1), show_progress=False)
    bundle_path = out / "checkpoint" / "optimizer.pt"
    bundle = torch.load(bundle_path, weights_only=True)  # what a normal run saves loads safely
    assert set(bundle) == {"optimizer", "scheduler", "torch_rng"}
    marker = tmp_path / "code-ran"
    torch.save({**bundle, "extra": RunsCode(marker)}, bundle_path)
    with pytest.raises(ConfigError, match="could run code.*refused"):
        train(config(base, dataset, out, epochs=1, resume=True), show_progress=False)
    assert not marker.exists()


def test_resume_refuses_a_different_run(base, dataset, tmp_path):
    out = tmp_path / "o"
    train(config(base, dataset, out, epochs=1), show_progress=False)
    with pytest.raises(ConfigError, match="different run"):
        train(config(base, dataset, out, epochs=1, batch_size=4, resume=True),
              show_progress=False)


def test_early_stopping_keeps_the_best_epoch(base, dataset, tmp_path, monkeypatch):
    out = tmp_path / "o"
    written = []
    real_write = artifacts.write_adapter
    monkeypatch.setattr(artifacts, "write_adapter",
                        lambda *a, **k: written.append(1) or real_write(*a, **k))
    # Nothing can beat the first epoch by 100 nats: two epochs later the run stops.
    cfg = config(base, dataset, out, epochs=6, early_stop_patience=2, minimum_improvement=100.0)
    cfg.dataset.validation_path = str(dataset)
    result = train(cfg, show_progress=False)
    assert len(result.history) == 3 and result.stopped_early
    assert result.best_epoch == 1 and len(written) == 1  # the artifact is epoch 1's
    assert all("validation_loss" in h and "validation_ece" in h for h in result.history)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["best_epoch"] == 1 and summary["stopped_early"] is True

    # Without the impossible threshold the same run goes the distance.
    cfg = config(base, dataset, tmp_path / "p", epochs=3, early_stop_patience=2)
    cfg.dataset.validation_path = str(dataset)
    assert len(train(cfg, show_progress=False).history) == 3


def test_schedule_warms_up_then_decays_to_zero():
    f = schedule(warmup=3, total=10)
    values = [f(s) for s in range(11)]
    assert values[:3] == pytest.approx([0.25, 0.5, 0.75])
    assert values[3] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[3:], values[4:]))
    assert values[10] == 0.0
    cosine = schedule(warmup=0, total=10, kind="cosine")
    assert cosine(0) == pytest.approx(1.0) and cosine(5) == pytest.approx(0.5)
    assert cosine(10) == pytest.approx(0.0)
    assert schedule(warmup=2, total=10, kind="constant")(9) == 1.0


def test_a_run_that_does_not_beat_the_untrained_model_warns(base, dataset, tmp_path):
    """The untrained validation accuracy is measured before the first step; a run whose kept
    epoch does not beat it (learning rate 0: nothing moves) says so and records it."""
    from rich.console import Console

    console = Console(record=True, width=200)
    cfg = config(base, dataset, tmp_path / "o", epochs=1, learning_rate=0.0)
    cfg.dataset.validation_path = str(dataset)
    train(cfg, console=console, show_progress=False)
    summary = json.loads((tmp_path / "o" / "training_summary.json").read_text())
    before = summary["untrained_validation"]
    assert before["accuracy"] == summary["history"][0]["validation_accuracy"]
    assert summary["beat_untrained"] is False
    text = console.export_text()
    assert f"untrained: validation loss {before['loss']:.4f}" in text
    assert "does not beat the untrained model" in text
    steps = summary["history"][0]["steps"]  # no bar (show_progress off): plain lines instead
    assert re.search(rf"epoch 1/1: {steps}/{steps} batches, loss [0-9.]+, [0-9.]+ q/s", text)

    cfg = config(base, dataset, tmp_path / "p", epochs=1)  # no validation: nothing to compare
    train(cfg, console=Console(record=True), show_progress=False)
    summary = json.loads((tmp_path / "p" / "training_summary.json").read_text())
    assert summary["untrained_validation"] is None and summary["beat_untrained"] is None
