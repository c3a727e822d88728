"""LangGraph tests: skipped as a whole (with the reason) when langgraph is not installed."""

from unavailable import skip_unless

pytest_pycollect_makemodule = skip_unless(["langgraph"], "pip install 'teola[langchain]'")
