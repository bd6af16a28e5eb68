#!/usr/bin/env bash
# First: fp8 compute on the GPU's tensor cores (torch._scaled_mm, --compute fp8) answers the
# 100 probe requests like the float model (tests/test_quantize.py, skipped off such GPUs).
# Then: start real vLLM and SGLang on a CUDA machine and run the remote-engine agreement test against
# each (tests/test_backend_remote_live.py::test_external_engine_agrees: argmax agreement >= 0.95,
# mean TV <= 0.05 vs the in-process torch backend). Needs a GPU, network for pip, and the model
# as a hub id or local checkpoint directory whose tokenizer matches onepass's embedded default.
#   MODEL=HuggingFaceTB/SmolLM2-135M-Instruct scripts/gpu_check.sh
# Not run in the session that wrote it (no GPU was available there).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}
VLLM_VERSION=${VLLM_VERSION:-0.8.5}
SGLANG_VERSION=${SGLANG_VERSION:-0.4.6.post5}
nvidia-smi >/dev/null || { echo "no CUDA GPU: nothing to check" >&2; exit 2; }

wait_ready() {  # url seconds
    for _ in $(seq "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done
    echo "engine at $1 not ready" >&2; return 1
}

run_engine() {  # name venv install-spec start-command... (port 8300)
    local name=$1 venv=$2 spec=$3; shift 3
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q "$spec"
    "$venv/bin/python" "$@" > "/tmp/gpu_check_$name.log" 2>&1 &
    local pid=$!
    trap 'kill $pid 2>/dev/null || true' RETURN
    wait_ready http://127.0.0.1:8300/health 600
    ONEPASS_REMOTE_ENGINE=$name ONEPASS_REMOTE_URL=http://127.0.0.1:8300 \
    ONEPASS_REMOTE_MODEL=$MODEL .venv/bin/python -m pytest -q -s \
        tests/test_backend_remote_live.py::test_external_engine_agrees
}

.venv/bin/python -m pytest -q -s \
    tests/test_quantize.py::test_fp8_compute_on_a_gpu_answers_like_the_float_model

run_engine vllm .venv-vllm "vllm==$VLLM_VERSION" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --port 8300 --enable-prefix-caching --enable-prompt-tokens-details
run_engine sglang .venv-sglang "sglang[all]==$SGLANG_VERSION" -m sglang.launch_server \
    --model-path "$MODEL" --port 8300
echo "gpu_check: vLLM $VLLM_VERSION and SGLang $SGLANG_VERSION agree with onepass in process"
