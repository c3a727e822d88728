"""A simulated vector store: exact cosine search over named collections, profile-driven latency.

Results never depend on how ingestion was split or ordered: a collection maps document
ids (a hash of the text) to rows, so ingesting in stages, in any order, or twice, ends
in the same collection; search ranks by score, then by document id. That is what lets
stage decomposition be checked for equality against the unsplit graph.

    db = SimVectorDB(PROFILE, time_scale=0.0)
    ingest config: {"collection": "doc-7"}   -> outputs {"index": "doc-7"}
    search config: {"top_k": 4}, inputs {"vectors": [...], "index": "doc-7"}
                                             -> outputs {"hits": [[Document, ...], ...]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from teola_adapters.simulated.clock import EngineStats, SimClock, count_items, stable_hash
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import Document
from teola_core.profiles.profile import LatencyProfile

Row = tuple[Document, tuple[float, ...]]


def doc_id(text: str) -> str:
    """A document's id: a stable hash of its text, so equal texts are one row."""
    return f"d{stable_hash('doc', text):016x}"


class SimVectorDB(Engine):
    """INGEST (`texts`, `vectors` -> `index`) and SEARCH (`vectors`, `index` -> `hits`).

    Ingest writes into the collection named by the node's `collection` config, or, when
    the node names none, a per-query collection named after the query id (one table per
    query, as the paper's setup does). The `index` it returns is the collection name.
    Re-ingesting a text replaces its row (upsert). A batch costs the profile's `ingest`
    latency at its total rows plus its `search` latency at its total query vectors.
    """

    def __init__(
        self, profile: LatencyProfile, *, time_scale: float = 1.0, name: str = "vectordb", concurrency: int = 1
    ) -> None:
        for op in ("ingest", "search"):
            profile.curve(op)  # fail now, not on the first batch
        self.name = name
        self.kinds = frozenset({PrimitiveKind.INGEST, PrimitiveKind.SEARCH})
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency)
        self.clock = SimClock(time_scale, concurrency)
        self.stats = EngineStats()
        self._collections: dict[str, dict[str, Row]] = {}

    def collection(self, name: str) -> list[Document]:
        """The documents of a collection, by id (for tests and inspection)."""
        return [row[0] for _, row in sorted(self._rows(name).items())]

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        ingest = sum(count_items(c.inputs.get("texts")) for c in calls if c.node.kind == PrimitiveKind.INGEST)
        search = sum(count_items(c.inputs.get("vectors")) for c in calls if c.node.kind == PrimitiveKind.SEARCH)
        seconds = (self.profile.latency("ingest", ingest) if ingest else 0.0) + (
            self.profile.latency("search", search) if search else 0.0
        )
        async with self.clock.slot():
            await self.clock.spend(seconds)
            self.stats.record(len(calls), ingest + search, seconds)
            # Work happens when the batch completes: an ingest is visible only after it ends.
            return [self._one(c) for c in calls]

    def _one(self, call: Call) -> CallResult:
        try:
            if call.node.kind == PrimitiveKind.INGEST:
                return {"index": self._ingest(call)}
            if call.node.kind == PrimitiveKind.SEARCH:
                return {"hits": self._search(call.inputs, call.node.config)}
            raise TypeError(f"{self.name} runs ingest and search primitives, not {call.node.describe()}")
        except (KeyError, TypeError, ValueError) as exc:  # this call fails alone, as the protocol says
            return exc

    def _ingest(self, call: Call) -> str:
        texts, vectors = call.inputs["texts"], call.inputs["vectors"]
        if len(texts) != len(vectors):
            raise ValueError(f"ingest got {len(texts)} texts but {len(vectors)} vectors")
        name = str(call.node.config.get("collection", call.query_id))
        rows = self._collections.setdefault(name, {})
        for text, vector in zip(texts, vectors, strict=True):
            if not isinstance(text, str):
                raise TypeError(f"ingest needs text, got {type(text).__name__}")
            doc = Document(doc_id(text), text)
            rows[doc.id] = (doc, tuple(float(x) for x in vector))
        return name

    def _search(self, inputs: Mapping[str, Any], config: Mapping[str, Any]) -> list[list[Document]]:
        rows = self._rows(inputs["index"])
        top_k = int(config["top_k"])
        hits = []
        for query in inputs["vectors"]:
            q = tuple(float(x) for x in query)
            scored = []
            for doc, vec in rows.values():
                if len(vec) != len(q):
                    raise ValueError(f"query vector has {len(q)} dimensions, the collection {len(vec)}")
                scored.append((-sum(a * b for a, b in zip(q, vec, strict=True)), doc.id, doc))
            scored.sort(key=lambda t: (t[0], t[1]))
            hits.append([doc for _, _, doc in scored[:top_k]])
        return hits

    def _rows(self, name: Any) -> dict[str, Row]:
        try:
            return self._collections[name]
        except KeyError:
            known = ", ".join(sorted(self._collections)) or "none"
            raise KeyError(f"{self.name}: no collection {name!r} (have: {known})") from None
