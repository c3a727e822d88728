"""Teola: run LangChain and LlamaIndex applications as optimized primitive graphs."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def optimize(runnable: Any, **options: Any) -> Any:
    """A drop-in, optimized version of a LangChain runnable or a LlamaIndex object.

    LangChain runnables: see `teola_langchain.runnable` (extra `langchain`). LangGraph
    compiled graphs (and `create_agent` agents): see `teola_langchain.langgraph`. LlamaIndex
    objects (recognised by the package of a class in their MRO: query engines,
    `QueryPipeline`s, `Workflow`s, agents): see `teola_llamaindex` (extra `llamaindex`).
    """
    packages = {c.__module__.split(".")[0] for c in type(runnable).__mro__}
    if packages & {"llama_index", "workflows"}:
        return _optimize_llamaindex(runnable, **options)
    if "langgraph" in packages:
        from teola_langchain.langgraph import optimize as optimize_langgraph

        return optimize_langgraph(runnable, **options)
    if not (
        packages & {"langchain_core", "langchain", "langgraph"} or isinstance(runnable, dict) or callable(runnable)
    ):
        raise TypeError(
            f"teola.optimize takes a LangChain runnable (or a dict or function LangChain makes one of), a LangGraph "
            f"graph, or a LlamaIndex query engine, QueryPipeline, Workflow or agent; got {type(runnable).__name__}"
        )
    try:
        from teola_langchain.runnable import optimize as optimize_langchain
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "langchain_core":
            raise ModuleNotFoundError(
                "teola.optimize needs langchain-core: pip install 'teola[langchain]'", name=exc.name
            ) from exc
        raise
    return optimize_langchain(runnable, **options)


def _optimize_llamaindex(obj: Any, **options: Any) -> Any:
    try:
        from teola_llamaindex import optimize as optimize_llamaindex
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "llama_index":
            raise ModuleNotFoundError(
                "teola.optimize needs llama-index-core: pip install 'teola[llamaindex]'", name=exc.name
            ) from exc
        raise
    return optimize_llamaindex(obj, **options)


__all__ = ["__version__", "optimize"]
