"""Teola: run LangChain and LlamaIndex applications as optimized primitive graphs."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def optimize(runnable: Any, **options: Any) -> Any:
    """A drop-in, optimized version of a LangChain runnable (see `teola_langchain.runnable`).

    Needs the `langchain` extra: `pip install 'teola[langchain]'`.
    """
    try:
        from teola_langchain.runnable import optimize as optimize_langchain
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "langchain_core":
            raise ModuleNotFoundError(
                "teola.optimize needs langchain-core: pip install 'teola[langchain]'", name=exc.name
            ) from exc
        raise
    return optimize_langchain(runnable, **options)


__all__ = ["__version__", "optimize"]
