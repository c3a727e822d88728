"""Teola: run LangChain and LlamaIndex applications as optimized primitive graphs."""

from __future__ import annotations

__version__ = "0.1.0"
