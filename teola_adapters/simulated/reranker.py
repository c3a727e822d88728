"""A simulated cross-encoder reranker: word-overlap scores, profile-driven latency.

A document's score depends only on (query, document text), so reranking in stages and
merging the stages' top-k lists by a stable sort on score gives the unsplit result:
every document a stage drops has `top_k` documents ahead of it in that stage that also
rank ahead of it overall.

    reranker = SimReranker(PROFILE, time_scale=0.0)
    config {"top_k": 3}, inputs {"query": "...", "docs": [Document, ...]}
        -> outputs {"docs": [Scored, ...]}   # best first, ties in input order
"""

from __future__ import annotations

import math

from teola_adapters.simulated.clock import stable_hash
from teola_adapters.simulated.embedding import words
from teola_adapters.simulated.one_curve import OneCurveEngine
from teola_core.engines.protocol import Call, CallResult
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import Document, Scored
from teola_core.profiles.profile import LatencyProfile

JITTER = 1e-3  # below the smallest overlap difference of short texts: breaks ties only


def relevance(query: str, text: str) -> float:
    """Cosine of the two texts' word sets, plus a deterministic jitter below `JITTER`."""
    q, d = set(words(query)), set(words(text))
    overlap = len(q & d) / math.sqrt(len(q) * len(d)) if q and d else 0.0
    return overlap + JITTER * stable_hash("rerank", query, text) / 2.0**64


class SimReranker(OneCurveEngine):
    """RERANK: (`query`, `docs`) -> `docs` as scored, sorted, cut to the node's `top_k`.

    A batch costs the profile's `rerank` latency at its total (query, document) pairs.
    Without `top_k` in the node's config every document is returned, ranked.
    """

    kind = PrimitiveKind.RERANK
    curve = "rerank"
    items_port = "docs"

    def __init__(
        self, profile: LatencyProfile, *, time_scale: float = 1.0, name: str = "reranker", concurrency: int = 1
    ) -> None:
        super().__init__(profile, time_scale=time_scale, name=name, concurrency=concurrency)

    def _one(self, call: Call) -> CallResult:
        try:
            if call.node.kind != PrimitiveKind.RERANK:
                raise TypeError(f"{self.name} runs rerank primitives, not {call.node.describe()}")
            query, docs = call.inputs["query"], call.inputs["docs"]
            if not isinstance(query, str):
                raise TypeError(f"rerank needs a text query, got {type(query).__name__}")
            if not all(isinstance(d, Document) for d in docs):
                raise TypeError("rerank needs a list of Document")
            ranked = sorted((Scored(d, relevance(query, d.text)) for d in docs), key=lambda s: -s.score)
            top_k = call.node.config.get("top_k")
            return {"docs": ranked if top_k is None else ranked[: int(top_k)]}
        except (KeyError, TypeError) as exc:  # this call fails alone, as the protocol says
            return exc
