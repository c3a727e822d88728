"""Errors that name what was wrong: the graph, the node, the port, the pass."""

from __future__ import annotations


class TeolaError(Exception):
    """Base of every error Teola raises itself."""


class GraphError(TeolaError):
    """A graph is malformed (cycle, missing producer, type mismatch, ...)."""


class PassError(TeolaError):
    """A pass failed or left an invalid graph; the message names the pass."""

    def __init__(self, pass_name: str, message: str) -> None:
        super().__init__(f"pass {pass_name!r}: {message}")
        self.pass_name = pass_name


class PrimitiveError(TeolaError):
    """A primitive failed while running; names the query, the node and its engine.

    The original exception is `__cause__` and also kept as `.error`.
    """

    def __init__(self, query_id: str, node_desc: str, error: BaseException) -> None:
        super().__init__(f"query {query_id}: primitive {node_desc} failed: {type(error).__name__}: {error}")
        self.query_id = query_id
        self.node = node_desc
        self.error = error


class QueryCancelled(TeolaError):
    """The query was cancelled before it finished."""
