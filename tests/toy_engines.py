"""Deterministic toy engines for tests: every output is a pure function of the inputs.

No randomness, no clocks, no models. Use `toy_engines()` for a fresh `EngineSet` (the
vector store keeps state, so take a fresh set per evaluation you compare):

    engines = toy_engines()                      # "embedder", "vectordb", "reranker", "llm"
    out = await evaluate(graph, inputs, engines)

- embedder (EMBED): `vector(text)`, an 8-dim unit vector from the text's hash.
- vectordb (INGEST, SEARCH): ingest appends (text, vector) pairs to the collection named
  by the node's `collection` config (per query) and returns an `IndexHandle`; several
  ingests of one collection return equal handles. Search scores by dot product and
  returns the top_k documents per query vector, ties broken by text, so the
  result does not depend on the order in which parts were ingested.
- reranker (RERANK): `score(query, text)` in {0, 0.25, ..., 1} (coarse, so ties occur);
  returns `Scored` documents sorted by score (stable), cut to top_k. Plain strings are
  accepted as documents.
- llm (PREFILL, PARTIAL_PREFILL, FULL_PREFILL, DECODE, PARTIAL_DECODE): prefills return
  a `KVHandle` holding the prompt (a full prefill checks that its prefix really is a
  prefix). `generate(prompt, split_unit)` makes the text: with `Lines` or `JsonArray`
  it has `item_count(prompt)` items (0 to 4, from the prompt's hash, so pipelined
  decodes see fewer and more items than expected); otherwise a few words. A decode
  whose node declares "items" also returns the parsed items. `stream()` yields the
  same text in several deltas.

Each engine records the calls it ran in `calls` (node id and input item count).
`meb_profile("embedder", embed=4)` makes a profile whose max efficient batch is 4.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import Call, CallResult, Engine, EngineSet
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.split_units import JsonArray, Lines, SplitUnit
from teola_core.ir.types import Document, KVHandle, Scored
from teola_core.profiles.profile import Curve, LatencyProfile

DIM = 8
_WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "ember", "frost", "grove")


def digest(*parts: object) -> int:
    """A stable (per-process-independent) hash of the parts' string forms."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def vector(text: str) -> tuple[float, ...]:
    raw = hashlib.sha256(text.encode()).digest()
    values = [b / 255.0 - 0.5 for b in raw[:DIM]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return tuple(round(v / norm, 6) for v in values)


def score(query: str, text: str) -> float:
    return (digest("rerank", query, text) % 5) / 4


def item_count(prompt: str) -> int:
    return digest("items", prompt) % 5


def generate(prompt: str, split_unit: SplitUnit | None) -> str:
    """The toy LLM's whole output for a prompt."""
    if isinstance(split_unit, Lines | JsonArray):
        items = [f"{_WORDS[digest(prompt, i) % len(_WORDS)]} {i}" for i in range(item_count(prompt))]
        return json.dumps(items) if isinstance(split_unit, JsonArray) else "\n".join(items)
    n = 3 + digest("words", prompt) % 4
    return " ".join(_WORDS[digest(prompt, i) % len(_WORDS)] for i in range(n))


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return round(sum(x * y for x, y in zip(a, b, strict=True)), 9)


@dataclass(frozen=True)
class IndexHandle:
    engine: str
    query_id: str
    collection: str


class _ToyEngine(Engine):
    """Runs each call on its own; a failing call fails alone (as the protocol says)."""

    def __init__(self, name: str, profile: LatencyProfile | None = None) -> None:
        self.name = name
        self.profile = profile
        self.calls: list[tuple[str, int]] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult] = []
        for call in calls:
            self.calls.append((call.node.id, call.items))
            if call.node.kind not in self.kinds:
                results.append(TypeError(f"engine {self.name!r} does not run {call.node.kind.value} primitives"))
                continue
            try:
                results.append(self.compute(call))
            except Exception as exc:  # returned as this call's result, per the Engine protocol
                results.append(exc)
        return results

    def compute(self, call: Call) -> Mapping[str, Any]:
        raise NotImplementedError


class ToyEmbedder(_ToyEngine):
    kinds = frozenset({PrimitiveKind.EMBED})

    def compute(self, call: Call) -> Mapping[str, Any]:
        return {"vectors": [vector(str(t)) for t in call.inputs["texts"]]}


class ToyVectorDB(_ToyEngine):
    kinds = frozenset({PrimitiveKind.INGEST, PrimitiveKind.SEARCH})

    def __init__(self, name: str, profile: LatencyProfile | None = None) -> None:
        super().__init__(name, profile)
        self.collections: dict[IndexHandle, list[tuple[Document, tuple[float, ...]]]] = {}

    def compute(self, call: Call) -> Mapping[str, Any]:
        if call.node.kind == PrimitiveKind.INGEST:
            handle = IndexHandle(self.name, call.query_id, str(call.node.config.get("collection", "default")))
            rows = self.collections.setdefault(handle, [])
            for text, vec in zip(call.inputs["texts"], call.inputs["vectors"], strict=True):
                rows.append((Document(f"doc-{digest(text) % 10**6}", str(text)), tuple(vec)))
            return {"index": handle}
        rows = self.collections.get(call.inputs["index"], [])
        top_k = int(call.node.config["top_k"])
        hits = []
        for q in call.inputs["vectors"]:
            scored = sorted(rows, key=lambda row: (-_dot(q, row[1]), row[0].text))
            hits.append([doc for doc, _ in scored[:top_k]])
        return {"hits": hits}


class ToyReranker(_ToyEngine):
    kinds = frozenset({PrimitiveKind.RERANK})

    def compute(self, call: Call) -> Mapping[str, Any]:
        query = str(call.inputs["query"])
        docs = [d if isinstance(d, Document) else Document(f"item-{digest(d)}", str(d)) for d in call.inputs["docs"]]
        ranked = sorted((Scored(d, score(query, d.text)) for d in docs), key=lambda s: -s.score)
        top_k = call.node.config.get("top_k")
        return {"docs": ranked if top_k is None else ranked[: int(top_k)]}


class ToyLLM(_ToyEngine):
    kinds = frozenset(
        {
            PrimitiveKind.PREFILL,
            PrimitiveKind.PARTIAL_PREFILL,
            PrimitiveKind.FULL_PREFILL,
            PrimitiveKind.DECODE,
            PrimitiveKind.PARTIAL_DECODE,
        }
    )
    delta_size = 5

    def compute(self, call: Call) -> Mapping[str, Any]:
        kind = call.node.kind
        if kind == PrimitiveKind.PREFILL:
            return {"kv": KVHandle(self.name, call.inputs["prompt"])}
        if kind == PrimitiveKind.PARTIAL_PREFILL:
            return {"kv": KVHandle(self.name, call.inputs["prefix"])}
        if kind == PrimitiveKind.FULL_PREFILL:
            prompt, prefix = call.inputs["prompt"], call.inputs["prefix_kv"].prompt
            if not str(prompt).startswith(str(prefix)):
                raise ValueError(f"partial prefill {prefix!r} is not a prefix of the prompt {prompt!r}")
            return {"kv": KVHandle(self.name, prompt)}
        unit = call.node.config.get("split_unit")
        text = generate(str(call.inputs["kv"].prompt), unit)
        outputs: dict[str, Any] = {"text": text}
        if call.node.output_port("items") is not None and unit is not None:
            outputs["items"] = unit.parse(text)
        return outputs

    async def stream(self, call: Call) -> AsyncIterator[str]:
        text = generate(str(call.inputs["kv"].prompt), call.node.config.get("split_unit"))
        for start in range(0, len(text), self.delta_size):
            yield text[start : start + self.delta_size]


def meb_curve(meb: int, seconds: float = 1.0) -> Curve:
    """Latency `seconds` up to `meb` items, then linear: throughput peaks exactly at `meb`."""
    if meb <= 1:
        return Curve(((1, seconds), (2, 2 * seconds)))
    return Curve(((1, seconds), (meb, seconds), (2 * meb, 2 * seconds)))


def meb_profile(engine: str, seconds: float = 1.0, **meb: int) -> LatencyProfile:
    """A profile with one `meb_curve` per op: `meb_profile("vectordb", ingest=4, search=2)`."""
    return LatencyProfile(engine, {op: meb_curve(m, seconds) for op, m in meb.items()})


def toy_engines(profiles: Mapping[str, LatencyProfile] | None = None) -> EngineSet:
    """Fresh engines named embedder, vectordb, reranker and llm (profiles by those names)."""
    profiles = profiles or {}
    engines = EngineSet()
    for cls, name in ((ToyEmbedder, "embedder"), (ToyVectorDB, "vectordb"), (ToyReranker, "reranker"), (ToyLLM, "llm")):
        engines.add(cls(name, profiles.get(name)))
    return engines
