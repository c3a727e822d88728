#!/usr/bin/env bash
# The LlamaIndex suites, one fresh venv per llama-index-core line (the two lines cannot
# share an environment): 0.12.52.post1 (QueryPipeline + query engines + `teola bench
# --llamaindex`) and 0.14.x (query engines, Workflows), each with the OpenAILike client
# release of its line (the prefix warm-up tests). Fails if pytest fails, or if a
# line ran fewer tests than it must (so a suite that silently stopped being collected
# fails CI). Both lines also install Ray and run their drop-ins on the Ray backend
# (tests/ray_backend/test_ray_llamaindex.py, a two-node loopback cluster). Then, per line, LlamaIndex's own tests of that release plain and routed
# through `teola.optimize` (tests/conformance/run.py; about a minute a line): fails on
# any regression or differing result not listed in known_differences.py, skips (saying
# why) when the shared copy of those tests is absent (../shared/conformance beside the
# checkout, or $TEOLA_CONFORMANCE_DIR). Venvs go to $TEOLA_LI_VENVS
# (default: a temporary folder, removed at exit).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${TEOLA_LI_PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ -n "${TEOLA_LI_VENVS:-}" ]; then
  BASE="$TEOLA_LI_VENVS"
  mkdir -p "$BASE"
else
  BASE="$(mktemp -d)"
  trap 'rm -rf "$BASE"' EXIT
fi

# line name, llama-index-core requirement, OpenAILike requirement, least passed tests,
# least passed QueryPipeline tests, least of LlamaIndex's own tests passing plain, and
# "ray" to run the Ray backend's LlamaIndex tests too
run_line() {
  local name="$1" spec="$2" openai_like="$3" least="$4" least_pipeline="$5" least_own="$6"
  local venv="$BASE/venv-$name" report="$BASE/$name.xml" extras="dev,serve" tests=(tests/llamaindex_adapter)
  if [ "${7:-}" = ray ]; then
    extras="$extras,ray"
    tests+=(tests/ray_backend/test_ray_llamaindex.py)
  fi
  echo "== llamaindex: $name ($spec)"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$spec" "$openai_like" -e "$ROOT[$extras]"
  (cd "$ROOT" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" --junitxml="$report")
  "$venv/bin/python" - "$report" "$least" "$least_pipeline" "$name" <<'PY'
import sys
import xml.etree.ElementTree as ET

report, least, least_pipeline, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cases = list(ET.parse(report).iter("testcase"))
passed = [c for c in cases if not any(child.tag in ("failure", "error", "skipped") for child in c)]
pipeline = [c for c in passed if "test_li_pipeline" in c.get("classname", "")]
print(f"== llamaindex: {name}: {len(passed)} passed ({len(pipeline)} QueryPipeline)")
if len(passed) < least or len(pipeline) < least_pipeline:
    sys.exit(f"{name}: expected at least {least} passed tests ({least_pipeline} QueryPipeline)")
PY
  (cd "$ROOT" && "$venv/bin/python" tests/conformance/run.py llamaindex --install --least-passed "$least_own" \
    --workdir "$BASE/conformance-$name")
}

run_line li012 "llama-index-core==0.12.52.post1" "llama-index-llms-openai-like>=0.4,<0.5" 225 85 80 ray
run_line li014 "llama-index-core>=0.14,<0.15" "llama-index-llms-openai-like>=0.8,<0.9" 143 0 50 ray
echo "== llamaindex: both lines passed"
