"""LlamaIndex adapter tests: skipped as a whole when llama-index-core is not installed.

The QueryPipeline suite needs llama-index-core <= 0.12 (QueryPipeline is gone from 0.13);
`.ci/llamaindex.sh` checks that each line ran the suites it must run.
"""

import importlib.util

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("llama_index") is None or importlib.util.find_spec("llama_index.core") is None:
    collect_ignore_glob = ["test_*.py"]
elif importlib.util.find_spec("llama_index.core.query_pipeline") is None:
    collect_ignore_glob = ["test_li_pipeline*.py"]
