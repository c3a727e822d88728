"""Rerankers: RERANK (`query`, `docs`) -> `docs` as `Scored`, best first, cut to `top_k`.

No PyPI package ships cross-encoder weights that work offline, so the embedded default
re-scores with the MiniLM embedding model (cosine of query and passage vectors); a
cross-encoder (sentence-transformers `CrossEncoder`) is used when a model path is given.

Both score every (query, document) pair of every call in a batch in one model call (the
model's cost per pair falls with batch size, as an embedder's does). Sorting is stable
(ties keep input order) and a score depends only on its pair, so reranking in stages and
merging stage outputs by score gives the unsplit result. A call with malformed inputs fails
alone; if the joint model call fails, each call is retried on its own.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from teola_adapters._optional import require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_adapters.embeddings.engine import SentenceTransformerEmbedder
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import kind_node
from teola_core.ir.types import Document, Scored
from teola_core.profiles.profile import LatencyProfile

_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")
Pairs = tuple[str, list[Document]]


def _pairs_of(call: Call, engine: str) -> Pairs:
    if call.node.kind != PrimitiveKind.RERANK:
        raise TypeError(f"{engine} runs rerank primitives, not {call.node.describe()}")
    for port in ("query", "docs"):
        if port not in call.inputs:
            raise KeyError(f"{call.node.describe()} has no `{port}` input")
    query, docs = call.inputs["query"], call.inputs["docs"]
    if not isinstance(query, str):
        raise TypeError(f"{call.node.describe()}: rerank needs a text query, got {type(query).__name__}")
    if isinstance(docs, str) or not isinstance(docs, Sequence) or not all(isinstance(d, Document) for d in docs):
        raise TypeError(f"{call.node.describe()}: rerank needs a list of Document")
    return query, list(docs)


class BatchedReranker(Engine):
    """The batching shared by the rerankers: subclasses score the pairs of several calls at once."""

    def __init__(self, name: str, profile: LatencyProfile | None, device: str | None = None) -> None:
        self.name = name
        self.kinds = frozenset({PrimitiveKind.RERANK})
        self.profile = profile
        self.limits = EngineLimits(concurrency=1, device=device)
        self.model_calls = 0

    @abstractmethod
    async def score(self, items: list[Pairs]) -> list[list[float]]:
        """One score per document of each (query, docs), higher is more relevant (one model call)."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        members: list[tuple[int, Pairs]] = []
        for i, call in enumerate(calls):
            try:
                members.append((i, _pairs_of(call, self.name)))
            except (KeyError, TypeError) as exc:  # this call fails alone
                results[i] = exc
        for i, outcome in await self._score_group(members, calls):
            results[i] = outcome
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    async def _score_group(
        self, members: list[tuple[int, Pairs]], calls: Sequence[Call]
    ) -> list[tuple[int, CallResult]]:
        if not members:
            return []
        try:
            self.model_calls += 1
            scores = await self.score([pairs for _, pairs in members])
        except Exception as exc:
            if len(members) == 1:
                return [(members[0][0], exc)]
            return [(i, out) for m in members for i, out in await self._score_group([m], calls)]
        out: list[tuple[int, CallResult]] = []
        for (i, (_, docs)), doc_scores in zip(members, scores, strict=True):
            ranked = sorted(
                (Scored(d, float(s)) for d, s in zip(docs, doc_scores, strict=True)), key=lambda s: -s.score
            )
            top_k = calls[i].node.config.get("top_k")
            out.append((i, {"docs": ranked if top_k is None else ranked[: int(top_k)]}))
        return out


class EmbeddingReranker(BatchedReranker):
    """Cosine re-scoring with a sentence-transformers embedder (default: MiniLM, shared if given).

    Every distinct query and passage text of the batch is embedded in one model call on the
    embedder's own thread (so reranking and embedding never compete for the cores).
    Score: cosine similarity in [-1, 1].
    """

    def __init__(
        self,
        embedder: SentenceTransformerEmbedder | None = None,
        *,
        name: str = "reranker",
        profile: ProfileSource = None,
    ) -> None:
        self.embedder = embedder if embedder is not None else SentenceTransformerEmbedder(name=f"{name}-model")
        self._owns_embedder = embedder is None
        # scores with the embedder's own model (and its one worker thread): the embedder's device
        super().__init__(name, load_profile(profile, name, _BUNDLED_PROFILE), self.embedder.limits.device)

    async def score(self, items: list[Pairs]) -> list[list[float]]:
        np = require("numpy", "local", "EmbeddingReranker")
        queries = list(dict.fromkeys(q for q, _ in items))
        passages = list(dict.fromkeys(d.text for _, docs in items for d in docs))
        query_vecs = await self.embedder.encode_async(queries, "query")
        passage_vecs = await self.embedder.encode_async(passages, "document") if passages else None
        if not self.embedder.normalize:  # cosine needs unit vectors
            query_vecs = query_vecs / np.linalg.norm(query_vecs, axis=1, keepdims=True)
            if passage_vecs is not None:
                passage_vecs = passage_vecs / np.linalg.norm(passage_vecs, axis=1, keepdims=True)
        q_row = {q: i for i, q in enumerate(queries)}
        p_row = {p: i for i, p in enumerate(passages)}
        scores = []
        for query, docs in items:
            if not docs:
                scores.append([])
                continue
            rows = passage_vecs[[p_row[d.text] for d in docs]]  # type: ignore[index]
            scores.append((rows @ query_vecs[q_row[query]]).tolist())
        return scores

    async def close(self) -> None:
        if self._owns_embedder:
            await self.embedder.close()


class CrossEncoderReranker(BatchedReranker):
    """A sentence-transformers `CrossEncoder` from a local folder (nothing fetched from a hub).

    Score: the model's output for the (query, passage) pair (after its activation, e.g. a
    sigmoid for one label). `batch_size` pairs per forward pass.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        name: str = "reranker",
        device: str = "cpu",
        batch_size: int = 32,
        max_length: int | None = None,
        profile: ProfileSource = None,
    ) -> None:
        st = require("sentence_transformers", "local", "CrossEncoderReranker")
        super().__init__(name, load_profile(profile, name), device)
        self.model_path = Path(model)
        self.model = st.CrossEncoder(str(model), device=device, local_files_only=True, max_length=max_length)
        self.batch_size = batch_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"teola-{name}")

    def predict(self, pairs: list[tuple[str, str]]) -> Any:
        """Blocking: one score per pair (runs on the engine's thread)."""
        return self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)

    async def score(self, items: list[Pairs]) -> list[list[float]]:
        pairs = [(query, d.text) for query, docs in items for d in docs]
        loop = asyncio.get_running_loop()
        flat = (await loop.run_in_executor(self._executor, self.predict, pairs)).tolist() if pairs else []
        scores, start = [], 0
        for _, docs in items:
            scores.append([float(s) for s in flat[start : start + len(docs)]])
            start += len(docs)
        return scores

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)


def make_reranker(
    model: str | Path | None = None,
    *,
    embedder: SentenceTransformerEmbedder | None = None,
    name: str = "reranker",
    profile: ProfileSource = None,
) -> BatchedReranker:
    """A cross-encoder if a model folder is given, else MiniLM cosine re-scoring (the embedded default)."""
    if model is not None:
        return CrossEncoderReranker(model, name=name, profile=profile)
    return EmbeddingReranker(embedder, name=name, profile=profile)


async def measure_profile(
    engine: BatchedReranker,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    repeats: int = 3,
    save_to: str | Path | None = None,
) -> LatencyProfile:
    """Measure the `rerank` curve (seconds for one query against n passages) and install it."""
    from teola_adapters.embeddings.engine import profile_texts
    from teola_core.profiles.profiler import profile_engine

    node = kind_node("profile.rerank", PrimitiveKind.RERANK, engine.name)
    texts = profile_texts(max(batch_sizes) * (repeats + 2))
    docs = [Document(f"p{i}", t) for i, t in enumerate(texts)]
    runs = iter(range(10**9))

    def calls(n: int) -> list[Call]:
        start = next(runs) * n % max(1, len(docs) - n)  # fresh passages each run: no embedding reuse
        return [Call("profile", node, {"query": "which lantern is by the river?", "docs": docs[start : start + n]})]

    profile = await profile_engine(engine, calls, "rerank", batch_sizes, repeats, save_to=save_to)
    engine.profile = profile
    return profile
