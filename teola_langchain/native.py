"""LangChain components over Teola's embedded engines, and their mapping back to those engines.

The components are plain LangChain (a user can run them without Teola):

- `ChatSmolLM`: a `BaseChatModel` over a `LlamaCppEngine` (SmolLM2-135M-Instruct, greedy).
  Written here rather than taken from langchain-community (`ChatLlamaCpp`): that wrapper
  calls `create_chat_completion`, which reuses the previous prompt's prefix at whatever
  token it ends, so its greedy output may differ (by llama.cpp's batch grouping) from a
  split prefill; this model runs exactly the engine primitives Teola runs.
- `MiniLMEmbeddings`: LangChain `Embeddings` over a `SentenceTransformerEmbedder`; every
  query is embedded alone (batching changes a vector in its 7th digit).
- `PgVectorCollection`: a LangChain `VectorStore` over one collection of a `PgVectorStore`.

`optimize_native(chain, ...)` is `teola.optimize(chain, engines=native_engines(...))`:
the public `engines=` option maps these components to native engines, each provably the
same computation:

- a `ChatSmolLM` step runs on `NativeChatEngine`, which renders the prompt with the same
  `render_chat` the model uses and hands the model's own `LlamaCppEngine` the PREFILL /
  PARTIAL_PREFILL / FULL_PREFILL / DECODE / PARTIAL_DECODE primitives. The model's
  `invoke` is PREFILL(render_chat(messages)) then DECODE(max_tokens) on that engine;
  the engine guarantees that PARTIAL_PREFILL(prefix) + FULL_PREFILL(prompt) + DECODE
  gives the text of PREFILL(prompt) + DECODE (canonical 32-token chunks, greedy), so
  prefill split (the instructions and question prefilled while retrieval runs) and
  decode pipelining (each expanded query retrieved while the model writes the next one)
  apply without changing a token. A prefix of a chat prompt (`PromptPrefix`) renders as
  its whole messages plus the open message's start, a text prefix of the full prompt.
  The model's own LangChain callbacks (on_llm_start/end) do not fire on this path.
- a `VectorStoreRetriever` over a `PgVectorCollection` is decomposed into EMBED + SEARCH
  (the store's `similarity_search(q, k)` is `similarity_search_by_vector(
  embeddings.embed_query(q), k)` by construction; `register_store_proof` records that in
  `teola_langchain.retrievers`' table of proofs). EMBED and SEARCH then run on the
  LangChain engines (per-query `aembed_query`, per-vector search), exactly as the store.

Sync methods run the engines' async calls with `asyncio.run` (LangChain calls them from
worker threads without a running loop); async methods await them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict

from teola_adapters._llm import LLM_KINDS
from teola_core.engines.protocol import Call, CallResult, Engine
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_langchain import retrievers
from teola_langchain.engines import Chooser, LangChainLLMEngine
from teola_langchain.prompts import PromptPrefix
from teola_langchain.runnable import TeolaRunnable

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


def chat_role(role: str) -> str:
    """SmolLM2's role name for a LangChain message type (or a ChatMessage's own role)."""
    return _ROLES.get(role, role)


def render_chat(messages: Sequence[BaseMessage]) -> str:
    """SmolLM2's ChatML prompt for the messages, ending with the open assistant turn."""
    turns = [f"<|im_start|>{chat_role(_role_of(m))}\n{m.text}<|im_end|>\n" for m in messages]
    return "".join(turns) + "<|im_start|>assistant\n"


def _role_of(message: BaseMessage) -> str:
    return str(getattr(message, "role", None) or message.type)


def llm_node(kind: PrimitiveKind, engine: str, **config: Any) -> Node:
    """A prefill or decode node of `kind` on `engine` (decodes output `text`)."""
    spec = spec_of(kind)
    inputs = spec.inputs if spec.inputs is not None else (PortSpec("kv", PortType.KV),)
    outputs = spec.outputs if spec.outputs is not None else (PortSpec("text", PortType.TEXT),)
    return Node(f"chat.{kind.value}", kind, inputs, outputs, engine=engine, config=config, caps=spec.caps)


class ChatSmolLM(BaseChatModel):
    """SmolLM2 on llama.cpp, greedy: PREFILL the ChatML prompt, then DECODE up to `max_tokens`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any  # a teola_adapters.llamacpp.LlamaCppEngine
    max_tokens: int = 128

    @property
    def _llm_type(self) -> str:
        return "teola-smollm2-llamacpp"

    async def _complete(self, messages: list[BaseMessage], stop: list[str] | None) -> ChatResult:
        engine = self.engine
        prefill = llm_node(PrimitiveKind.PREFILL, engine.name)
        (kv,) = (await engine.run_one(Call("chat", prefill, {"prompt": render_chat(messages)}))).values()
        decode = llm_node(PrimitiveKind.DECODE, engine.name, max_tokens=self.max_tokens, stop=stop)
        text = (await engine.run_one(Call("chat", decode, {"kv": kv})))["text"]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return asyncio.run(self._complete(messages, stop))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self._complete(messages, stop)


class MiniLMEmbeddings(Embeddings):
    """MiniLM through a `SentenceTransformerEmbedder`: documents in one call, each query alone."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.encode(texts, "document").tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.encode([text], "query")[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return (await self.embedder.encode_async(texts, "document")).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.embedder.encode_async([text], "query"))[0].tolist()


class PgVectorCollection(VectorStore):
    """One collection of a `PgVectorStore`, searched by cosine distance (read-only here)."""

    def __init__(self, store: Any, collection: str, embeddings: Embeddings) -> None:
        self.store = store
        self.collection = collection
        self._embeddings = embeddings
        spec = spec_of(PrimitiveKind.SEARCH)
        assert spec.inputs is not None and spec.outputs is not None
        self._inputs, self._outputs, self._caps = spec.inputs, spec.outputs, spec.caps

    @property
    def embeddings(self) -> Embeddings:
        return self._embeddings

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, **kwargs: Any) -> list[str]:
        raise NotImplementedError("the demo collection is written by teola.demo.corpus.ingest")

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict] | None = None, **kwargs: Any):  # type: ignore[override]
        raise NotImplementedError("build a PgVectorCollection over an ingested collection")

    async def _search(self, vector: list[float], k: int) -> list[Document]:
        config = {"top_k": k}
        node = Node("store.search", PrimitiveKind.SEARCH, self._inputs, self._outputs, self.store.name, config)
        node = replace(node, caps=self._caps)
        call = Call("store", node, {"vectors": [vector], "index": self.collection})
        (hits,) = (await self.store.run_one(call))["hits"]
        return [Document(page_content=h.text, id=h.id, metadata=dict(h.metadata)) for h in hits]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return asyncio.run(self._search(embedding, k))

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return await self._search(embedding, k)

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return self.similarity_search_by_vector(self._embeddings.embed_query(query), k)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return await self.asimilarity_search_by_vector(await self._embeddings.aembed_query(query), k)


# -- the mapping to native engines -------------------------------------------------------
def render_prefix(prefix: PromptPrefix) -> str:
    """The ChatML text of a prompt's ready start: its whole messages, then the open one unclosed."""
    text = "".join(f"<|im_start|>{chat_role(_role_of(m))}\n{m.text}<|im_end|>\n" for m in prefix.messages)
    if prefix.open_role is not None:
        text += f"<|im_start|>{chat_role(prefix.open_role)}\n{prefix.open_text}"
    return text


def _prompt_text(value: Any) -> str:
    if isinstance(value, PromptValue):
        return render_chat(value.to_messages())
    if isinstance(value, PromptPrefix):
        return render_prefix(value)
    raise TypeError(f"expected a LangChain prompt value, got {type(value).__name__}")


_PROMPT_PORT = {
    PrimitiveKind.PREFILL: "prompt",
    PrimitiveKind.PARTIAL_PREFILL: "prefix",
    PrimitiveKind.FULL_PREFILL: "prompt",
}


class NativeChatEngine(Engine):
    """A `ChatSmolLM`'s LLM primitives on its own `LlamaCppEngine` (see the module docstring).

    Only steps that are the model itself run natively; a binding around it (`bind(stop=...)`,
    `with_config`) changes what the model computes or reports, so its calls go to
    `fallback`, the LangChain engine that calls the binding (prefill and decode of one step
    carry the same `runnable`, so they always land on the same side).
    """

    kinds = LLM_KINDS

    def __init__(self, name: str, model: ChatSmolLM, fallback: Engine, replicas: Sequence[Any] = ()) -> None:
        self.name = name
        self.model = model
        self.inner = model.engine
        self.instances = [model.engine, *replicas]
        self.fallback = fallback
        # One call per batch: llama.cpp runs a batch's calls one after another but returns them
        # together, so a bigger batch only makes a finished decode wait for the next prefill.
        # One batch at a time per instance.
        self.limits = replace(self.inner.limits, max_batch_items=1, concurrency=len(self.instances))
        self.profile = self.inner.profile
        self._home: OrderedDict[str, int] = OrderedDict()  # query -> its instance (bounded)
        self._busy = [0] * len(self.instances)
        self._next = 0

    def _native(self, call: Call) -> bool:
        return call.node.config.get("runnable", self.model) is self.model

    def _instance(self, call: Call) -> Any:
        """The query's instance: every call of a query goes where its KV states are.

        A query's first call picks the least busy instance (ties: round robin).
        """
        query = call.query_id.split("/")[0]
        home = self._home.get(query)
        if home is None:
            n = len(self.instances)
            home = min(range(n), key=lambda i: (self._busy[i], (i - self._next) % n))
            self._next = (home + 1) % n
            self._home[query] = home
            if len(self._home) > 4096:
                self._home.popitem(last=False)
        return home

    def _inner_call(self, call: Call) -> Call:
        port = _PROMPT_PORT.get(call.node.kind)
        if port is None:
            return call
        return Call(call.query_id, call.node, {**call.inputs, port: _prompt_text(call.inputs[port])})

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        native: list[tuple[int, Call]] = []
        other = [(i, c) for i, c in enumerate(calls) if not self._native(c)]
        for i, call in enumerate(calls):
            if not self._native(call):
                continue
            try:
                native.append((i, self._inner_call(call)))
            except (KeyError, TypeError) as exc:  # this call fails alone
                results[i] = exc
        if other:
            for (i, _), outcome in zip(other, await self.fallback.run([c for _, c in other]), strict=True):
                results[i] = outcome
        by_instance: dict[int, list[tuple[int, Call]]] = {}
        for i, call in native:
            by_instance.setdefault(self._instance(call), []).append((i, call))
        for home, members in by_instance.items():
            self._busy[home] += 1
            try:
                outcomes = await self.instances[home].run([c for _, c in members])
            finally:
                self._busy[home] -= 1
            for (i, _), outcome in zip(members, outcomes, strict=True):
                if isinstance(outcome, Mapping) and isinstance(outcome.get("text"), str):
                    outcome = {**outcome, "text": AIMessage(content=outcome["text"])}  # what the chat model returns
                results[i] = outcome
        return results  # type: ignore[return-value]

    async def stream(self, call: Call) -> AsyncIterator[str]:
        if not self._native(call):
            async for delta in self.fallback.stream(call):
                yield delta
            return
        home = self._instance(call)
        self._busy[home] += 1
        try:
            async for delta in self.instances[home].stream(call):
                yield delta
        finally:
            self._busy[home] -= 1


def register_store_proof() -> None:
    """Record that a retriever over `PgVectorCollection` may run as EMBED + SEARCH.

    Its `similarity_search(q, k)` and `asimilarity_search` embed the query with
    `embed_query`/`aembed_query` and call `(a)similarity_search_by_vector(v, k)`, and `k`
    is the only search kwarg they read (see the class). Idempotent.
    """
    retrievers._PROVEN_STORES.setdefault(
        PgVectorCollection,
        retrievers.StoreProof(
            frozenset({"k"}),
            ("similarity_search", "asimilarity_search", "similarity_search_by_vector", "asimilarity_search_by_vector"),
        ),
    )


def native_engines(replicas: Sequence[Any] = ()) -> Chooser:
    """The `engines=` choice that runs each `ChatSmolLM` of a chain on a `NativeChatEngine`.

    replicas: more `LlamaCppEngine`s loaded with the same model file and settings as the
      `ChatSmolLM`'s engine (the same computation, so the same greedy text); each query's
      calls stay on one instance (its KV states are there), queries spread over them.
    Other components keep Teola's default engines. The engines are chosen while the chain
    is traced, so the passes plan with the native engines' profiles.
    """

    def choose(component: Any, default: Engine) -> Engine | None:
        if type(component) is ChatSmolLM and isinstance(default, LangChainLLMEngine):
            return NativeChatEngine(default.name, component, default, _same_model(component.engine, replicas))
        return None

    return choose


def _same_model(engine: Any, replicas: Sequence[Any]) -> list[Any]:
    """The replicas, checked to compute what `engine` computes (model file, chunking, threads)."""
    for replica in replicas:
        ours = (engine.model_path, engine.chunk, engine.llm.n_threads, engine.n_ctx)
        theirs = (replica.model_path, replica.chunk, replica.llm.n_threads, replica.n_ctx)
        if ours != theirs:
            raise ValueError(f"replica {theirs} differs from the model's engine {ours} (model, chunk, threads, n_ctx)")
    return list(replicas)


def optimize_native(runnable: Any, *, replicas: Sequence[Any] = (), **options: Any) -> TeolaRunnable[Any, Any]:
    """`teola.optimize(runnable, engines=native_engines(replicas), **options)`, with the store proof registered.

    (It builds the `TeolaRunnable` itself: such a chain is never a LangGraph agent.)
    """
    register_store_proof()
    return TeolaRunnable(runnable, engines=native_engines(replicas), **options)
