"""The project's own top-level packages (the folders a newcomer sees beside `tests/`)."""

PACKAGES = (
    "teola",
    "teola_core",
    "teola_langchain",
    "teola_llamaindex",
    "teola_adapters",
    "teola_benchmarks",
    "teola_examples",
)
