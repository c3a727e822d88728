#!/usr/bin/env bash
# The one command for the real-vLLM integration tests (tests/vllm_real): set up (idempotent),
# then two phases, so that only one vLLM runs at a time on this 2-core machine:
#   1. in-process engine (VLLMLocalEngine): test_vllm_local.py, then test_vllm_local_ray.py
#      (the same engine inside a Ray actor); no server is up;
#   2. server: start it, run test_vllm_real.py (VLLMHTTPEngine) and test_vllm_local_http.py
#      (the HTTP engine's greedy text == phase 1's); with FRAMEWORK_PY (a Python with Teola's
#      `langchain` extra, e.g. the main venv's), also LangChain's ChatOpenAI/OpenAI warm-up
#      tests against it (tests/langchain_adapter/test_lc_vllm_real.py); stop the server (the
#      one this script started).
#
# Usage: [FRAMEWORK_PY=python] bash scripts/vllm-cpu/run-tests.sh [PORT]   (extra pytest args via PYTEST_ARGS)
set -euo pipefail
PORT="${1:-8011}"
VENV_DIR="${VENV_DIR:-/tmp/teola-vllm-venv}"
MODEL_DIR="${MODEL_DIR:-/tmp/teola-vllm-model}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$HERE/../.." && pwd)"
PY="$VENV_DIR/bin/python"

t0=$(date +%s)
bash "$HERE/setup.sh" "$VENV_DIR" "$MODEL_DIR"
# The Ray case of phase 1 needs Ray in this venv (teola's `ray` extra; ≈ 10 s, once).
if ! "$PY" -c 'import ray' >/dev/null 2>&1; then
  echo "installing ray into $VENV_DIR"
  "$PY" -m pip install --quiet "ray>=2.40" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
fi
t1=$(date +%s)
echo "setup: $((t1 - t0))s"

OUTPUTS="$(mktemp)"  # phase 1's greedy outputs, for phase 2's comparison
trap 'rm -f "$OUTPUTS"' EXIT
cd "$REPO_DIR"
status=0
# pytest exits 5 when PYTEST_ARGS deselected every test of a phase: not a failure.
run_pytest() { run_pytest_with "$PY" "$@"; }
run_pytest_with() {
  local python="$1"
  shift
  "$python" -m pytest -v -s -p no:cacheprovider "$@" || { rc=$?; [[ $rc -eq 5 ]] || status=$rc; }
}

# shellcheck disable=SC2086
TEOLA_VLLM_MODEL_DIR="$MODEL_DIR" TEOLA_VLLM_LOCAL_OUTPUTS="$OUTPUTS" \
  run_pytest tests/vllm_real/test_vllm_local.py tests/vllm_real/test_vllm_local_ray.py ${PYTEST_ARGS:-}
t2=$(date +%s)
echo "in-process phase: $((t2 - t1))s"

trap 'bash "$HERE/stop.sh" "$PORT"; rm -f "$OUTPUTS"' EXIT
bash "$HERE/serve.sh" "$PORT" "$VENV_DIR" "$MODEL_DIR"
t3=$(date +%s)
echo "server start-up: $((t3 - t2))s"
# shellcheck disable=SC2086
TEOLA_VLLM_URL="http://127.0.0.1:$PORT" TEOLA_VLLM_MODEL="${SERVED_MODEL_NAME:-smollm2}" \
  TEOLA_VLLM_LOCAL_OUTPUTS="$OUTPUTS" \
  run_pytest tests/vllm_real/test_vllm_real.py tests/vllm_real/test_vllm_local_http.py ${PYTEST_ARGS:-}
if [[ -n "${FRAMEWORK_PY:-}" ]]; then
  # shellcheck disable=SC2086
  TEOLA_VLLM_URL="http://127.0.0.1:$PORT" TEOLA_VLLM_MODEL="${SERVED_MODEL_NAME:-smollm2}" \
    run_pytest_with "$FRAMEWORK_PY" tests/langchain_adapter/test_lc_vllm_real.py ${PYTEST_ARGS:-}
fi
echo "server phase: $(( $(date +%s) - t3 ))s"
exit "$status"
