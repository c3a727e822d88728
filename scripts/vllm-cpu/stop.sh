#!/usr/bin/env bash
# Stop the vLLM server that serve.sh started on PORT (by the PID it recorded, nothing else).
# Usage: bash scripts/vllm-cpu/stop.sh [PORT]
set -euo pipefail
PORT="${1:-8011}"
PID_FILE="${STATE_DIR:-/tmp/teola-vllm}/vllm-$PORT.pid"
[[ -f "$PID_FILE" ]] || { echo "no $PID_FILE: nothing to stop"; exit 0; }
pid="$(cat "$PID_FILE")"
# A stale PID file (a run killed hard) may name a PID reused by something else: only stop
# a process that is this port's vLLM server.
cmdline="$( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null || true)"
if [[ "$cmdline" != *vllm.entrypoints.openai.api_server*"--port $PORT"* ]]; then
  echo "pid $pid is not the vLLM server on port $PORT (stale $PID_FILE): not stopping it"
  rm -f "$PID_FILE"
  exit 0
fi
if kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  echo "stopped vLLM server pid $pid"
fi
rm -f "$PID_FILE"
