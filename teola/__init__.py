"""Teola: run LangChain and LlamaIndex applications as optimized primitive graphs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
    with _framework_required("langchain_core", "langchain-core", "langchain"):
        from teola_langchain.runnable import optimize as optimize_langchain
    return optimize_langchain(runnable, **options)


def _optimize_llamaindex(obj: Any, **options: Any) -> Any:
    with _framework_required("llama_index", "llama-index-core", "llamaindex"):
        from teola_llamaindex import optimize as optimize_llamaindex
    return optimize_llamaindex(obj, **options)


@contextmanager
def _framework_required(package: str, distribution: str, extra: str) -> Iterator[None]:
    """Imports inside: a missing framework `package` fails naming the extra that installs it.

    A missing module of any other package is a real bug and propagates unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == package:
            raise ModuleNotFoundError(
                f"teola.optimize needs {distribution}: pip install 'teola[{extra}]'", name=exc.name
            ) from exc
        raise


__all__ = ["__version__", "optimize"]
