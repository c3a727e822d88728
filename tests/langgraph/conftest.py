"""LangGraph tests: skipped as a whole when langgraph is not installed."""

import importlib.util

if importlib.util.find_spec("langgraph") is None:
    collect_ignore_glob = ["test_*.py"]
