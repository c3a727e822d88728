"""A workflow's model and retriever calls as small Teola graphs, through proxies of its components.

    proxy = proxy_for(workflow.llm, router)    # a TeolaWorkflowLLM: same class family, same fields
    await proxy.achat(messages)                # one DECODE on the LLM's engine, at the step's depth

Each proxy registers its engine (`workflow_engines`) with the workflow's `CallRouter`
(`workflow_router`), which runs the call's graph. Sync and streaming calls go straight to
the wrapped object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms import LLM
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import PrivateAttr

from teola_llamaindex.engines import LlamaIndexRetrieverEngine, needs_embedding
from teola_llamaindex.prefix_warmup import load_watch_for
from teola_llamaindex.vector_retrieval import decomposable
from teola_llamaindex.workflow_engines import (
    EmbedRequest,
    LLMThunk,
    WorkflowEmbeddingEngine,
    WorkflowLLMEngine,
    WorkflowRetrieverEngine,
)
from teola_llamaindex.workflow_router import CallRouter


def _base_fields(obj: Any, base: type) -> dict[str, Any]:
    """The wrapped object's values of `base`'s pydantic fields, so base-class methods match."""
    return {name: getattr(obj, name) for name in base.model_fields if hasattr(obj, name)}


class TeolaWorkflowLLM(LLM):
    """An `LLM` whose async chat/complete calls run on Teola's LLM engine scheduler."""

    _inner: LLM = PrivateAttr()
    _router: CallRouter = PrivateAttr()
    _engine: str = PrivateAttr()

    def __init__(self, inner: LLM, router: CallRouter) -> None:
        super().__init__(**_base_fields(inner, LLM))
        self._inner = inner
        self._router = router
        self._engine = router.register(inner, "llm", lambda name: WorkflowLLMEngine(name, load_watch_for(inner)))

    @classmethod
    def class_name(cls) -> str:
        return "TeolaWorkflowLLM"

    @property
    def wrapped(self) -> LLM:
        return self._inner

    @property
    def metadata(self) -> LLMMetadata:
        return self._inner.metadata

    async def _routed(self, run: Callable[[], Awaitable[Any]]) -> Any:
        graph = self._router.graph("llm", self._engine, self._router.depth())
        return await self._router.call(graph, {"request": LLMThunk(run)})

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._routed(lambda: self._inner.achat(messages, **kwargs))

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await self._routed(lambda: self._inner.acomplete(prompt, formatted=formatted, **kwargs))

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._inner.chat(messages, **kwargs)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._inner.complete(prompt, formatted=formatted, **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._inner.stream_chat(messages, **kwargs)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._inner.stream_complete(prompt, formatted=formatted, **kwargs)

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return await self._inner.astream_chat(messages, **kwargs)

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return await self._inner.astream_complete(prompt, formatted=formatted, **kwargs)


class TeolaWorkflowEmbedding(BaseEmbedding):
    """A `BaseEmbedding` whose async embeddings run on Teola's embedding engine scheduler."""

    _inner: BaseEmbedding = PrivateAttr()
    _router: CallRouter = PrivateAttr()
    _engine: str = PrivateAttr()

    def __init__(self, inner: BaseEmbedding, router: CallRouter) -> None:
        super().__init__(**_base_fields(inner, BaseEmbedding))
        self._inner = inner
        self._router = router
        self._engine = router.register(inner, "embed", lambda name: WorkflowEmbeddingEngine(name, inner))

    @classmethod
    def class_name(cls) -> str:
        return "TeolaWorkflowEmbedding"

    @property
    def wrapped(self) -> BaseEmbedding:
        return self._inner

    async def _embed(self, mode: str, texts: Sequence[str]) -> list[Any]:
        graph = self._router.graph("embed", self._engine, self._router.depth())
        return await self._router.call(graph, {"request": EmbedRequest(mode, tuple(texts))})

    async def _aget_query_embedding(self, query: str) -> list[float]:
        (vector,) = await self._embed("query", [query])
        return vector

    async def _aget_text_embedding(self, text: str) -> list[float]:
        (vector,) = await self._embed("text", [text])
        return vector

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._embed("text", texts)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._inner._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._inner._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._inner._get_text_embeddings(texts)


class TeolaWorkflowRetriever(BaseRetriever):
    """A retriever whose async retrievals run as EMBED + SEARCH (or one SEARCH) on Teola."""

    def __init__(self, inner: BaseRetriever, router: CallRouter) -> None:
        # The wrapped retriever resolves its own object map (after SEARCH, or in its `aretrieve`).
        super().__init__(callback_manager=inner.callback_manager, verbose=inner._verbose)
        self._inner = inner
        self._router = router
        self._whole = router.register(inner, "retriever", lambda name: WorkflowRetrieverEngine(name, inner))
        self._split: tuple[str, str] | None = None
        if decomposable(inner):
            embed_model = inner._embed_model
            self._split = (
                router.register(embed_model, "embed", lambda name: WorkflowEmbeddingEngine(name, embed_model)),
                router.register(inner, "vectordb", lambda name: LlamaIndexRetrieverEngine(name, inner)),
            )

    @property
    def wrapped(self) -> BaseRetriever:
        return self._inner

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._inner.retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        router = self._router
        embeds = query_bundle.embedding is None and len(query_bundle.embedding_strs) > 0
        if self._split is not None and embeds and needs_embedding(self._inner):
            embed, search = self._split
            graph = router.graph("retrieve", embed, router.depth(), search=search)
            request = EmbedRequest("agg", tuple(query_bundle.embedding_strs))
            (hits,) = await router.call(graph, {"request": request, "bundles": [query_bundle]})
            # SEARCH ran the wrapped retriever's search only; its `aretrieve` would resolve
            # IndexNodes next, with this (unembedded) bundle.
            return await self._inner._ahandle_recursive_retrieval(query_bundle, hits)
        graph = router.graph("search", self._whole, router.depth())
        (hits,) = await router.call(graph, {"request": [query_bundle]})
        return hits


def proxy_for(value: Any, router: CallRouter) -> Any:
    """The proxy for a model or retriever attribute (by class), else None."""
    if isinstance(value, LLM):
        return TeolaWorkflowLLM(value, router)
    if isinstance(value, BaseEmbedding):
        return TeolaWorkflowEmbedding(value, router)
    if isinstance(value, BaseRetriever):
        return TeolaWorkflowRetriever(value, router)
    return None
