"""What a user's install relies on, checked without building it (tests/test_wheel_install.py
builds and installs the wheel): every third-party import declared where it is used, the data
the defaults read packaged (small, licensed, the upstream rows), the trainer's peft optional,
and ``--adapter`` refused with ``--backend remote`` (it would be recorded as applied and not
be)."""

from __future__ import annotations

import argparse
import ast
import functools
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from onepass.datasets import HANDWRITTEN_PROBES, PACKAGED_DATA_DIR

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "onepass"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in ``path`` (lazy ones inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"onepass"}


@functools.cache
def installed_modules() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    mapped = installed_modules().get(module)
    return {canonicalize_name(d) for d in mapped} if mapped else {canonicalize_name(module)}


# ------------------------------------------------------------------ declared dependencies


def test_every_third_party_import_is_declared_where_it_is_used():
    core = names(PYPROJECT["dependencies"])
    extras = {k: names(v) for k, v in PYPROJECT["optional-dependencies"].items()}
    # a module runs with the core plus the extra that serves it; the rest are the core's
    scope = {"server": "server", "generate/tools.py": "server", "bench.py": "bench",
             "commands/bench.py": "bench", "commands/serve.py": "server",
             "backends/llamacpp.py": "gguf", "evaluate.py": "plot", "train/lora.py": "train",
             "adapters.py": "train"}
    undeclared = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        extra = next((e for prefix, e in scope.items() if rel.startswith(prefix)), None)
        allowed = core | extras.get(extra, set())
        if extra == "bench":
            allowed |= extras["server"] | extras["plot"]
        for module in imports(path):
            if not distributions_of(module) & allowed:
                undeclared.append(f"{rel}: {module} (extra {extra or 'none: core'})")
    assert undeclared == []


def test_the_core_leaves_out_the_trainer_and_the_tools_and_ranges_torch():
    core = names(PYPROJECT["dependencies"])
    assert not core & {"peft", "jevbench", "jsonschema", "fastapi", "pytest", "matplotlib"}
    torch = next(Requirement(r) for r in PYPROJECT["dependencies"] if r.startswith("torch"))
    assert "2.13.0" in torch.specifier and "2.14.0" not in torch.specifier
    extras = PYPROJECT["optional-dependencies"]
    assert {"server", "train", "gguf", "docs", "bench", "dev"} <= set(extras)
    dev = Requirement(next(r for r in extras["dev"] if r.startswith("onepass[")))
    assert {"server", "train", "bench", "docs", "plot"} <= dev.extras  # the tests need them all
    assert {"build", "packaging"} <= names(extras["dev"])


def test_the_installer_pins_the_torch_it_tests_before_the_project():
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "TORCH_VERSION=2.13.0" in script
    assert script.index('"torch==$TORCH_VERSION"') < script.index('-e ".[dev]"')
    assert 'pip install -q -e ".[dev]"' in script  # .ci/run gets everything the tests need


def test_the_licence_is_apache_2_and_packaged():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
    assert PYPROJECT["license"] == "Apache-2.0" and "LICENSE" in PYPROJECT["license-files"]


# ------------------------------------------------------------------ packaged data


def test_the_packaged_subsets_are_small_licensed_and_documented():
    files = [p for p in PACKAGED_DATA_DIR.rglob("*") if p.is_file() and "__pycache__" not in
             p.parts]
    assert sum(p.stat().st_size for p in files) < 300_000
    clinc = (PACKAGED_DATA_DIR / "clinc150" / "LICENSE").read_text()
    banking = (PACKAGED_DATA_DIR / "banking77" / "LICENSE").read_text()
    assert "Attribution 3.0" in clinc and "Attribution 4.0" in banking
    note = (PACKAGED_DATA_DIR / "README.md").read_text()
    assert "828f809" in note and "57ec275" in note and "CC-BY-3.0" in note


def test_the_packaged_subsets_hold_what_every_default_reads():
    from onepass.bench import BenchConfig, datasets
    from onepass.commands.quantize import DEFAULT_SAMPLES, default_probes
    from onepass.quant.calibrate import calibration_requests

    calibration = calibration_requests("shipped", DEFAULT_SAMPLES, PACKAGED_DATA_DIR)
    assert len(calibration) == DEFAULT_SAMPLES
    assert any("intent" in r["questions"] for r in calibration)  # BANKING77 is in the mix
    probes = default_probes(PACKAGED_DATA_DIR)
    assert len(probes) == 100 and len({json.dumps(p, sort_keys=True) for p in probes}) == 100
    sets = datasets(BenchConfig(data_dir=PACKAGED_DATA_DIR))
    sizes = {name: {k: len(v) for k, v in parts.items()} for name, parts in sets.items()}
    assert sizes == {"clinc150": {"test": 100, "fit": 100, "teach": 500},
                     "banking77": {"test": 100, "fit": 100, "teach": 300},
                     "clinc150-noul": {"test": 100, "fit": 100, "teach": 500}}


def test_the_packaged_subsets_are_the_upstream_rows_regenerated_byte_for_byte(
        data_dir, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_package_data.py"),
                          "--data-dir", str(data_dir), "--output", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for rel in ("clinc150/data_full.json", "clinc150/domains.json", "clinc150/LICENSE",
                "banking77/train.csv", "banking77/test.csv", "banking77/categories.json",
                "banking77/LICENSE", "handwritten.jsonl"):
        assert (tmp_path / rel).read_bytes() == (PACKAGED_DATA_DIR / rel).read_bytes(), rel
    full = json.loads((data_dir / "clinc150" / "data_full.json").read_text())
    part = json.loads((PACKAGED_DATA_DIR / "clinc150" / "data_full.json").read_text())
    for split, rows in part.items():
        assert {tuple(r) for r in rows} <= {tuple(r) for r in full[split]}, split


def test_the_probe_cases_are_the_benchmarks_ones():
    assert HANDWRITTEN_PROBES.read_bytes() == (
        ROOT / "benchmarks" / "data" / "handwritten.jsonl").read_bytes()


def test_the_default_data_is_the_environment_then_the_checkout_then_the_package(
        monkeypatch, tmp_path):
    from onepass.commands.common import default_data_dir

    monkeypatch.setenv("ONEPASS_SHARED_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path / "data"  # as given, even when absent
    monkeypatch.delenv("ONEPASS_SHARED_DIR")
    beside = ROOT.parent / "shared" / "data"
    expected = beside if (beside / "clinc150").is_dir() else PACKAGED_DATA_DIR
    assert default_data_dir() == expected


# ------------------------------------------------------------------ the trainer's peft


def test_a_peft_adapter_without_peft_names_the_extra(monkeypatch, tmp_path):
    from onepass.adapters import AdapterError, apply_adapter

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(AdapterError, match=r"onepass\[train\]"):
        apply_adapter(object(), tmp_path)


def test_lora_training_without_peft_names_the_extra(monkeypatch):
    from onepass.train.config import ConfigError
    from onepass.train.lora import apply_lora

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"onepass\[train\]"):
        apply_lora(object(), rank=4, alpha=8, dropout=0.0, target_modules=["q_proj"])


def test_the_library_imports_without_peft():
    script = ("import sys; sys.modules['peft'] = None; import onepass, onepass.engine, "
              "onepass.adapters, onepass.cli, onepass.quant.artifact, onepass.train.loop, "
              "onepass.commands.train; print('ok')")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ------------------------------------------------------------------ --adapter with remote

REMOTE = ["--backend", "remote", "--engine", "vllm", "--engine-url", "http://127.0.0.1:9"]


def test_backend_options_refuse_an_adapter_for_a_remote_engine():
    from onepass.commands.common import backend_options

    args = argparse.Namespace(backend="remote", engine="vllm", engine_url="http://x",
                              engine_api_key=None, n_ctx=None, n_threads=None, adapter="out/a")
    with pytest.raises(SystemExit, match="--adapter needs --backend torch"):
        backend_options(args)
    args.adapter = None
    assert backend_options(args)["backend"] == "remote"


def test_the_library_refuses_an_adapter_for_a_remote_engine():
    """``DecisionEngine.from_pretrained`` too: before, it recorded the adapter as applied
    while the engine served its own weights (and so accepted a calibration fitted for it)."""
    from onepass import DecisionEngine

    with pytest.raises(ValueError, match="--adapter needs --backend torch"):
        DecisionEngine.from_pretrained(backend="remote", engine="vllm",
                                       engine_url="http://127.0.0.1:9", adapter="out/a")


@pytest.mark.parametrize("command", [
    ["decide", "--input", str(ROOT / "examples" / "requests.jsonl"), "--output", "-"],
    ["generate", "hello"],
    ["serve", "--port", "9"],
])
def test_every_command_refuses_adapter_with_backend_remote(command, tmp_path):
    out = subprocess.run([sys.executable, "-m", "onepass.cli", *command, *REMOTE,
                          "--adapter", str(tmp_path)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode != 0
    assert "--adapter needs --backend torch" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
