"""LangChain adapter tests: skipped as a whole when langchain-core is not installed."""

import importlib.util

if importlib.util.find_spec("langchain_core") is None:
    collect_ignore_glob = ["test_*.py"]
