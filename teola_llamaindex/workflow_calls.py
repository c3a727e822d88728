"""A workflow's model and retriever calls as small Teola graphs, through proxies of its components.

    proxy = proxy_for(workflow.llm, router)    # a TeolaWorkflowLLM: same class family, same fields
    await proxy.achat(messages)                # one DECODE on the LLM's engine, at the step's depth

`CallRouter` keeps one `LocalRuntime` per event loop, shared by every run of a workflow, so
concurrent runs' calls meet in the same engine schedulers; a call's depth is its step's
(`workflows.step_depths`). Sync and streaming calls go straight to the wrapped object.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits, EngineSet, PerCallEngine
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.local import LocalRuntime
from teola_llamaindex.common import unwrap_error
from teola_llamaindex.engines import LlamaIndexRetrieverEngine, needs_embedding
from teola_llamaindex.vector_retrieval import decomposable

try:  # the workflow library's per-step context: which step is running (for the depth)
    from workflows.runtime.types.results import StepWorkerStateContextVar as _STEP_CONTEXT
except ImportError:  # another workflows release: every call gets the workflow's full depth
    _STEP_CONTEXT = None

_DEPTH = "teola_depth"  # node config entry: this node's share of the call's depth


def _node_depth(node: Node) -> float:
    """Depth cost of a node: what the graph builder stored, 0 for input/output nodes."""
    return float(node.config.get(_DEPTH, 0.0))


# -- engines ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Thunk:
    """One LLM call, as the step made it (the engine awaits it)."""

    run: Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class _EmbedRequest:
    """One embedding call: "query" (one text), "text" (a batch) or "agg" (a retriever's query)."""

    mode: str
    texts: tuple[str, ...]


class WorkflowLLMEngine(PerCallEngine):
    """A workflow's LLM: each DECODE call awaits the step's own call on the wrapped LLM."""

    kinds = frozenset({PrimitiveKind.DECODE})
    limits = EngineLimits(concurrency=64)

    def __init__(self, name: str) -> None:
        self.name = name

    async def run_call(self, call: Call) -> dict[str, Any]:
        return {"text": await call.inputs["kv"].run()}


class WorkflowEmbeddingEngine(Engine):
    """A workflow's embed model; the text batches of one engine batch go out as one request.

    One batch at a time (like one model instance): calls issued while a batch runs
    queue, and the next batch takes them together, whichever run issued them.
    """

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=1)

    def __init__(self, name: str, embed_model: BaseEmbedding) -> None:
        self.name = name
        self.embed_model = embed_model

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        requests: list[_EmbedRequest] = [c.inputs["texts"] for c in calls]
        texts = [t for r in requests if r.mode == "text" for t in r.texts]
        singles = [self._one(r) for r in requests if r.mode != "text"]
        merged, *results = await asyncio.gather(self._texts(texts), *singles, return_exceptions=True)
        others = iter(results)
        out: list[CallResult] = []
        offset = 0
        for request in requests:
            if request.mode != "text":
                out.append(next(others))
            elif isinstance(merged, BaseException):  # the merged request failed: its calls fail
                out.append(merged)
            else:
                n = len(request.texts)
                out.append({"vectors": merged[offset : offset + n]})
                offset += n
        return out

    async def _texts(self, texts: list[str]) -> list[Any]:
        """The text calls' embeddings, in requests of at most the model's `embed_batch_size`."""
        size = max(1, self.embed_model.embed_batch_size)
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        vectors = await asyncio.gather(*(self.embed_model._aget_text_embeddings(c) for c in chunks))
        return [v for chunk in vectors for v in chunk]

    async def _one(self, request: _EmbedRequest) -> dict[str, Any]:
        if request.mode == "query":
            (text,) = request.texts
            return {"vectors": [await self.embed_model._aget_query_embedding(text)]}
        return {"vectors": [await self.embed_model.aget_agg_embedding_from_queries(list(request.texts))]}


class WorkflowRetrieverEngine(PerCallEngine):
    """A retriever as one SEARCH: `aretrieve(bundle)` as the step would call it."""

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16)

    def __init__(self, name: str, retriever: BaseRetriever) -> None:
        self.name = name
        self.retriever = retriever

    async def run_call(self, call: Call) -> dict[str, Any]:
        return {"hits": [await self.retriever.aretrieve(bundle) for bundle in call.inputs["index"]]}


# -- the shared runtime ----------------------------------------------------------------


class CallRouter:
    """Engines, per-loop runtimes and the call graphs of one optimized workflow."""

    def __init__(self, policy: str, depths: dict[str, int]) -> None:
        self.engines = EngineSet()
        self.policy = policy
        self.depths = depths
        self.max_depth = max(depths.values(), default=1)
        self.run_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("teola_workflow_run", default=None)
        self._graphs: dict[tuple[str, ...], Graph] = {}
        self._runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LocalRuntime] = weakref.WeakKeyDictionary()
        self._hooks: list[RuntimeHook] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def register(self, component: object, role: str, make: Callable[[str], Engine]) -> str:
        """The engine of `component` in `role` (one per object and role, named after its class)."""
        return self.engines.engine_for(component, role, make)

    def add_hook(self, hook: RuntimeHook) -> None:
        with self._lock:
            self._hooks.append(hook)
            for runtime in self._runtimes.values():
                runtime.add_hook(hook)

    def runtime(self) -> LocalRuntime:
        loop = asyncio.get_running_loop()
        with self._lock:
            runtime = self._runtimes.get(loop)
            if runtime is None:
                runtime = LocalRuntime(self.engines, policy=self.policy, depth_cost=_node_depth)
                for hook in self._hooks:
                    runtime.add_hook(hook)
                self._runtimes[loop] = runtime
            return runtime

    def depth(self) -> int:
        """The issuing step's depth (see the module docstring)."""
        state = _STEP_CONTEXT.get(None) if _STEP_CONTEXT is not None else None
        if state is None:
            return self.max_depth
        return self.depths.get(state.state.step_name, self.max_depth)

    def graph(self, kind: str, engine: str, depth: int, search: str | None = None) -> Graph:
        """The call's p-graph, cached per shape (see the module docstring).

        kind "llm": DECODE; "embed": EMBED; "search": one SEARCH that is the whole
        retrieval; "retrieve": EMBED on `engine`, then SEARCH on `search`.
        """
        key = (kind, engine, str(depth), search or "")
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        b = GraphBuilder(f"workflow.{kind}")
        request = b.input("request")
        if kind == "llm":
            node = b.add(
                PrimitiveKind.DECODE,
                {"kv": request},
                engine=engine,
                config={_DEPTH: depth},
                output_ports=(PortSpec("text", PortType.ANY),),
                name="call",
            )
            b.output(result=Value(node.id, "text"))
        elif kind == "embed":
            node = b.add(PrimitiveKind.EMBED, {"texts": request}, engine=engine, config={_DEPTH: depth}, items=1)
            b.output(result=Value(node.id, "vectors"))
        elif kind == "search":
            b.output(result=b.search(request, request, engine=engine, top_k=1, items=1, **{_DEPTH: depth}))
        elif kind == "retrieve" and search is not None:
            bundles = b.input("bundles")
            node = b.add(PrimitiveKind.EMBED, {"texts": request}, engine=engine, config={_DEPTH: 1}, items=1)
            vectors = Value(node.id, "vectors")
            b.output(result=b.search(vectors, bundles, engine=search, top_k=1, items=1, **{_DEPTH: depth}))
        else:
            raise ValueError(f"unknown call shape {kind!r} (search engine: {search!r})")
        graph = self._graphs[key] = b.build(chain_modules=False)
        return graph

    async def call(self, graph: Graph, inputs: dict[str, Any]) -> Any:
        """Run one call's graph; the caller gets the wrapped object's own exception."""
        qid = f"{self.run_key.get() or 'call'}/{next(self._ids)}"
        try:
            out = await self.runtime().run(graph, inputs, query_id=qid)
        except PrimitiveError as exc:
            error = unwrap_error(exc, {})
        else:
            return out["result"]
        raise error


# -- proxies ---------------------------------------------------------------------------


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
        self._engine = router.register(inner, "llm", WorkflowLLMEngine)

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
        return await self._router.call(graph, {"request": _Thunk(run)})

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
        return await self._router.call(graph, {"request": _EmbedRequest(mode, tuple(texts))})

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
            request = _EmbedRequest("agg", tuple(query_bundle.embedding_strs))
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
