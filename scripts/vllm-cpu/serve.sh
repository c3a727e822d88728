#!/usr/bin/env bash
# Start the vLLM CPU server (set up by setup.sh) in the background and wait for /health.
#
# Usage: bash scripts/vllm-cpu/serve.sh [PORT] [VENV_DIR] [MODEL_DIR]
#   PORT default 8011; writes the server's PID to $STATE_DIR/vllm-PORT.pid and its log to
#   $STATE_DIR/vllm-PORT.log (STATE_DIR default /tmp/teola-vllm). Stop it with stop.sh.
# Env: SERVED_MODEL_NAME (default smollm2), START_TIMEOUT_S (default 300), MAX_MODEL_LEN
# (default 2048), VLLM_EXTRA_ARGS (more `api_server` options); vLLM's own variables pass through.
set -euo pipefail

PORT="${1:-8011}"
VENV_DIR="${2:-/tmp/teola-vllm-venv}"
MODEL_DIR="${3:-/tmp/teola-vllm-model}"
STATE_DIR="${STATE_DIR:-/tmp/teola-vllm}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-smollm2}"
START_TIMEOUT_S="${START_TIMEOUT_S:-300}"
PID_FILE="$STATE_DIR/vllm-$PORT.pid"
LOG_FILE="$STATE_DIR/vllm-$PORT.log"
URL="http://127.0.0.1:$PORT"

mkdir -p "$STATE_DIR"
if curl -fsS -o /dev/null "$URL/health" 2>/dev/null; then
  echo "something already answers $URL/health; not starting another server" >&2
  exit 1
fi
[[ -x "$VENV_DIR/bin/python" && -f "$MODEL_DIR/model.safetensors" ]] || {
  echo "no venv at $VENV_DIR or no model at $MODEL_DIR: run scripts/vllm-cpu/setup.sh first" >&2
  exit 1
}

# KV cache 2 GiB; reserve no core for vLLM's own threads (else it takes one of our two);
# eager mode: 28 s start-up instead of 96 s of torch.compile.
# MAX_MODEL_LEN (default 2048) and VLLM_EXTRA_ARGS (more server options, split on spaces)
# serve the benchmarks' settings, e.g. the agents bench's small KV cache.
start=$(date +%s)
read -r -a extra_args <<<"${VLLM_EXTRA_ARGS:-}"
VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" VLLM_CPU_NUM_OF_RESERVED_CPU=0 \
  nohup "$VENV_DIR/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL_DIR" --served-model-name "$SERVED_MODEL_NAME" \
  --host 127.0.0.1 --port "$PORT" --dtype float32 \
  --enable-prefix-caching --max-model-len "${MAX_MODEL_LEN:-2048}" --enforce-eager \
  "${extra_args[@]}" >"$LOG_FILE" 2>&1 &
pid=$!
echo "$pid" >"$PID_FILE"

for ((i = 0; i < START_TIMEOUT_S; i++)); do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "vLLM server (pid $pid) exited during start-up; last log lines:" >&2
    tail -n 40 "$LOG_FILE" >&2
    rm -f "$PID_FILE"
    exit 1
  fi
  if curl -fsS -o /dev/null "$URL/health" 2>/dev/null; then
    echo "vLLM server pid $pid ready at $URL (model $SERVED_MODEL_NAME) after $(( $(date +%s) - start ))s; log $LOG_FILE"
    exit 0
  fi
  sleep 1
done
echo "vLLM server (pid $pid) not healthy after ${START_TIMEOUT_S}s; stopping it. Log: $LOG_FILE" >&2
kill "$pid" 2>/dev/null || true
rm -f "$PID_FILE"
exit 1
