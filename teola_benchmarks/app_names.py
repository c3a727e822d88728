"""The example apps `teola bench` accepts, by framework: names only (an example's module is
imported when its bench asks), so the command's parser and the benches share them without
importing any framework."""

import importlib
from types import ModuleType

# `--langchain` (`teola_examples.<name>`).
LANGCHAIN_EXAMPLES = (
    "naive_rag",
    "multi_query_rag",
    "multi_query_retriever",
    "rerank_rag",
    "assign_pipeline",
    "checked_rag",
)
# `--llamaindex`: QueryPipelines (`teola_benchmarks.llamaindex.examples`, llama-index-core
# <= 0.12), query engines (`...llamaindex.query_engines`, both lines) and workflows
# (`...llamaindex.workflows`, 0.14).
LLAMAINDEX_WORKFLOWS = ("drafts_workflow",)
LLAMAINDEX_EXAMPLES = ("multi_query_rag", "fusion_rag", "naive_rag", "fusion_query_engine", *LLAMAINDEX_WORKFLOWS)
# `--langgraph` (`teola_examples.langgraph_<name>`).
LANGGRAPH_EXAMPLES = ("rag", "map_reduce")
LANGGRAPH_AGENTS = "create_agents"  # `create_agent` agents replaying the agent traces (`langgraph/agents.py`)


def import_example(name: str, known: tuple[str, ...], prefix: str = "") -> ModuleType:
    """`teola_examples.<prefix><name>`, if `name` is one of `known`; a third-party package the
    example needs and lacks is named in the error."""
    if name not in known:
        raise ValueError(f"unknown example {name!r} (known: {', '.join(known)})")
    try:
        return importlib.import_module(f"teola_examples.{prefix}{name}")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.startswith("teola"):
            raise
        raise ModuleNotFoundError(
            f"example {name!r} imports {exc.name!r}: install the package that provides it"
        ) from exc
