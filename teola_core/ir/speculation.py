"""Speculative nodes: engine work that only fills time the engine would otherwise idle.

A pass may add work that shortens the critical path when the engine is free (rerank
pre-scoring scores every ingested text before the search says which ones matter) but
that would delay other queries' work where the engine is busy. Such a node carries a
`Speculation` in its config (`SPECULATIVE` key):

- its engine starts it only when it runs nothing and nothing else waits for it, alone;
- once it is the only input its `consumer` still waits for, an unstarted one is given up:
  it settles at once with the `withdrawn` outputs, which the consumer must handle exactly
  (rerank pre-scoring's consumer then sends every candidate to the ordinary rerank).

A started one runs to its end: its result is as good as the rest of the graph's. What the
graph computes does not depend on which way it went (the pass that adds one proves it),
so the reference evaluator simply runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from teola_core.ir.node import Node

SPECULATIVE = "speculative"  # node config key


@dataclass(frozen=True)
class Speculation:
    """consumer: the node whose wait decides (a data consumer of the speculative node, by
    id). withdrawn: the node's outputs, by port, when it is given up unstarted."""

    consumer: str
    withdrawn: Mapping[str, Any]


def speculation_of(node: Node) -> Speculation | None:
    """The node's speculation, or None for ordinary nodes."""
    found = node.config.get(SPECULATIVE)
    return found if isinstance(found, Speculation) else None
