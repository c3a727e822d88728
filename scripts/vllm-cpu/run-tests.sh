#!/usr/bin/env bash
# The one command for the real-vLLM integration test: set up (idempotent), start the
# server, run tests/vllm_real against it, stop the server (the one this script started).
#
# Usage: bash scripts/vllm-cpu/run-tests.sh [PORT]   (extra pytest args via PYTEST_ARGS)
set -euo pipefail
PORT="${1:-8011}"
VENV_DIR="${VENV_DIR:-/tmp/teola-vllm-venv}"
MODEL_DIR="${MODEL_DIR:-/tmp/teola-vllm-model}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$HERE/../.." && pwd)"

t0=$(date +%s)
bash "$HERE/setup.sh" "$VENV_DIR" "$MODEL_DIR"
t1=$(date +%s)
trap 'bash "$HERE/stop.sh" "$PORT"' EXIT
bash "$HERE/serve.sh" "$PORT" "$VENV_DIR" "$MODEL_DIR"
t2=$(date +%s)
echo "setup: $((t1 - t0))s, server start-up: $((t2 - t1))s"

cd "$REPO_DIR"
# shellcheck disable=SC2086
TEOLA_VLLM_URL="http://127.0.0.1:$PORT" TEOLA_VLLM_MODEL="${SERVED_MODEL_NAME:-smollm2}" \
  "$VENV_DIR/bin/python" -m pytest tests/vllm_real -v -s -p no:cacheprovider ${PYTEST_ARGS:-}
