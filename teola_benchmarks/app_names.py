"""The example apps `teola bench` accepts, by framework: names only, so the command's parser
and the benches share them without importing any framework."""

# `--langchain` (`teola_examples.<name>`).
LANGCHAIN_EXAMPLES = ("naive_rag", "multi_query_rag", "multi_query_retriever", "rerank_rag", "assign_pipeline")
# `--llamaindex`: QueryPipelines (`teola_benchmarks.llamaindex.examples`, llama-index-core
# <= 0.12) and query engines (`...llamaindex.query_engines`, both lines).
LLAMAINDEX_EXAMPLES = ("multi_query_rag", "fusion_rag", "naive_rag", "fusion_query_engine")
# `--langgraph` (`teola_examples.langgraph_<name>`).
LANGGRAPH_EXAMPLES = ("rag", "map_reduce")
