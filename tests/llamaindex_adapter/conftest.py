"""LlamaIndex adapter tests: skipped as a whole (with the reason) when llama-index-core is
not installed.

The QueryPipeline suite needs llama-index-core <= 0.12 (QueryPipeline is gone from 0.13);
`.ci/llamaindex.sh` checks that each line ran the suites it must run.
"""

from unavailable import missing, skip_unless

if missing(["llama_index.core"]):
    pytest_pycollect_makemodule = skip_unless(["llama_index.core"], "pip install 'teola[llamaindex]'")
else:
    pytest_pycollect_makemodule = skip_unless(
        ["llama_index.core.query_pipeline"], "QueryPipeline exists up to llama-index-core 0.12", "test_li_pipeline*.py"
    )
