"""LangChain adapter tests: skipped as a whole (with the reason) when langchain-core is not installed."""

from unavailable import skip_unless

pytest_pycollect_makemodule = skip_unless(["langchain_core"], "pip install 'teola[langchain]'")
