"""LangChain's `ContextualCompressionRetriever` with a `CrossEncoderReranker` (langchain-classic) as primitives.

What `ContextualCompressionRetriever.(a)invoke(query)` computes (langchain-classic 1.0,
`langchain_classic/retrievers/contextual_compression.py`, read at 1.0.8, with
langchain-core 1.8.3's `BaseRetriever` and `BaseDocumentCompressor`): inside its own
retriever run, `docs = base_retriever.(a)invoke(query, config={"callbacks":
run_manager.get_child()})`; if `docs` is empty it returns `[]`, else
`list(base_compressor.(a)compress_documents(docs, query, callbacks=run_manager.get_child()))`.
`CrossEncoderReranker.compress_documents` (`document_compressors/cross_encoder_rerank.py`)
is `model.score([(query, d.page_content) for d in docs])`, a stable sort by score
(highest first) and the first `top_n`; it opens no callback run. It has no async method of
its own: langchain-core's `acompress_documents` runs `compress_documents` in an executor.

Traced as: the retriever's run opened as `BaseRetriever` opens it, the base retriever as
EMBED + SEARCH inside it (`retrievers.decompose`), a RERANK on the compressor's engine, and
the run closed with `list(...)` of its output. The RERANK call is the compressor's own
`compress_documents` (sync query) or `acompress_documents` (async query) for that query,
with the callbacks the retriever would give it, so its result is the library's by
construction; an empty `docs` makes no call, as the retriever does not. Recognised by
qualified name, for the langchain-classic versions read.

Several queries share one `model.score` call only for a cross encoder whose exact class is
registered as scoring each pair on its own (`register_per_pair_cross_encoder`); each query's
result is then the compressor's own `compress_documents` run on its scores from that call.
None is registered by default: sentence-transformers' `CrossEncoder` (behind community's
`HuggingFaceCrossEncoder`) scores padded batches, so a pair's score can depend on which
pairs share its forward pass.

Runs as one call: any other compressor (an `LLMChainExtractor`, an `EmbeddingsFilter`, a
pipeline: their calls are not a rerank of one list), a base retriever that does not
decompose, a compressor or retriever with methods replaced, other langchain-classic versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.cross_encoders import BaseCrossEncoder

from teola_langchain.components import classes
from teola_langchain.components.classes import installed_within, qualified_name
from teola_langchain.components.retrievers import Decomposition, decompose

COMPRESSION_RETRIEVER = "langchain_classic.retrievers.contextual_compression.ContextualCompressionRetriever"
CROSS_ENCODER_RERANKER = "langchain_classic.retrievers.document_compressors.cross_encoder_rerank.CrossEncoderReranker"

# The methods each proof reads, as the class that defines them names them: a class whose
# method was replaced (a monkeypatch, a spy) or an instance that shadows one is not covered.
_RETRIEVER_METHODS = {
    "invoke": "langchain_core.retrievers.BaseRetriever.invoke",
    "ainvoke": "langchain_core.retrievers.BaseRetriever.ainvoke",
    "_get_relevant_documents": f"{COMPRESSION_RETRIEVER}._get_relevant_documents",
    "_aget_relevant_documents": f"{COMPRESSION_RETRIEVER}._aget_relevant_documents",
}
_COMPRESSOR_METHODS = {
    "compress_documents": f"{CROSS_ENCODER_RERANKER}.compress_documents",
    "acompress_documents": "langchain_core.documents.compressor.BaseDocumentCompressor.acompress_documents",
}

_PER_PAIR: set[type] = set()


def is_compression(retriever: Any) -> bool:
    """`retriever` is exactly langchain-classic's `ContextualCompressionRetriever` (any version)."""
    return qualified_name(retriever) == COMPRESSION_RETRIEVER


def why_opaque(retriever: Any) -> str | None:
    """Why this `ContextualCompressionRetriever` runs as one call, or None (see the module docstring);
    its base retriever must also decompose (`decompose_compression`)."""
    covered, version = installed_within(*classes.LANGCHAIN_CLASSIC)
    if not covered:
        _, first, before = classes.LANGCHAIN_CLASSIC
        return f"its source was read for langchain-classic >= {first}, < {before}, not {version}"
    replaced = _replaced(retriever, _RETRIEVER_METHODS)
    if replaced:
        return f"its {replaced} is not langchain-classic's own"
    compressor = retriever.base_compressor
    if qualified_name(compressor) != CROSS_ENCODER_RERANKER:
        return (
            f"its base_compressor {type(compressor).__name__} is not a CrossEncoderReranker "
            "(the only compressor proven to be a rerank of the retrieved list)"
        )
    replaced = _replaced(compressor, _COMPRESSOR_METHODS)
    if replaced:
        return f"its base_compressor's {replaced} is not langchain-classic's own"
    return None


def decompose_compression(retriever: Any) -> Decomposition | str:
    """The EMBED + SEARCH plan of the retriever's base retriever, or why the retriever runs as one call."""
    reason = why_opaque(retriever)
    if reason is not None:
        return reason
    plan = decompose(retriever.base_retriever)
    return f"base retriever: {plan}" if isinstance(plan, str) else plan


def traces(step: Any) -> bool:
    """`step` is a `ContextualCompressionRetriever` that runs as primitives (see the module docstring)."""
    return is_compression(step) and isinstance(decompose_compression(step), Decomposition)


def _replaced(obj: Any, methods: dict[str, str]) -> str | None:
    """The first of `methods` that `obj`'s class or instance does not take from where the proof read it."""
    own = {**vars(obj), **(getattr(obj, "__pydantic_extra__", None) or {})}
    for name, where in methods.items():
        method = getattr(type(obj), name, None)
        defined = f"{getattr(method, '__module__', None)}.{getattr(method, '__qualname__', None)}"
        if name in own or defined != where:
            return name
    return None


def register_per_pair_cross_encoder(cls: type) -> None:
    """Declare that `cls.score` scores each pair on its own, so several queries may share one call.

    The contract: for any list of pairs and any way to cut it into parts, `score(pairs)` is
    the concatenation of `score(part)` for each part (the very same floats), and `score`
    reads nothing of its caller's context (callbacks, config). A `CrossEncoderReranker`
    whose model is exactly of this class (its instance not shadowing `score`) then scores
    the pairs of every query waiting for it in one call. Register before `optimize()`.

        register_per_pair_cross_encoder(MyOverlapScorer)
    """
    if not (isinstance(cls, type) and issubclass(cls, BaseCrossEncoder)):
        raise TypeError(f"register_per_pair_cross_encoder takes a BaseCrossEncoder class, not {cls!r}")
    _PER_PAIR.add(cls)


def scores_per_pair(compressor: Any) -> bool:
    """The compressor is a proven `CrossEncoderReranker` whose model's exact class is registered per-pair."""
    model = getattr(compressor, "model", None)
    if qualified_name(compressor) != CROSS_ENCODER_RERANKER or type(model) not in _PER_PAIR:
        return False
    return "score" not in getattr(model, "__dict__", {})


class ScoresGiven(BaseCrossEncoder):
    """Hands a compressor the scores a shared `score` call computed for its own pairs."""

    def __init__(self, pairs: list[tuple[str, str]], scores: Sequence[float]) -> None:
        self.pairs = pairs
        self.scores = scores

    def score(self, text_pairs: list[tuple[str, str]]) -> Sequence[float]:  # type: ignore[override]
        if text_pairs != self.pairs:
            raise RuntimeError("teola: the compressor scored other pairs than the shared call did; please report this")
        return self.scores


def pairs_of(query: str, docs: Sequence[Any]) -> list[tuple[str, str]]:
    """The pairs `CrossEncoderReranker.compress_documents` scores."""
    return [(query, doc.page_content) for doc in docs]


def with_scores(compressor: Any, pairs: list[tuple[str, str]], scores: Sequence[float]) -> Any:
    """The compressor as it is, scoring `pairs` with the given `scores` (its own code does the rest)."""
    return compressor.model_copy(update={"model": ScoresGiven(pairs, scores)})


def describe(retriever: Any) -> str:
    """What the retriever runs as, for explain()."""
    base, compressor = retriever.base_retriever, retriever.base_compressor
    return (
        f"EMBED + SEARCH ({base.get_name()}) + RERANK ({type(compressor).__name__} "
        f"over {type(compressor.model).__name__}, top_n={compressor.top_n})"
    )
