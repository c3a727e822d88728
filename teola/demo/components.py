"""The demo's LangChain components over Teola's embedded engines (plain LangChain: a user
can run them without Teola).

    llm = ChatSmolLM(engine=LlamaCppEngine(n_threads=1), max_tokens=96)
    retriever = PgVectorCollection(store, collection, MiniLMEmbeddings(embedder)).as_retriever()
    chain = prompt | llm | StrOutputParser()

- `ChatSmolLM`: a `BaseChatModel` over a `LlamaCppEngine` (greedy): PREFILL of the ChatML
  prompt, then DECODE. Not langchain-community's `ChatLlamaCpp`: that one reuses the
  previous prompt at whatever token it ends, so its greedy text may differ (llama.cpp's
  batch grouping) from a split prefill; this model runs exactly the engine's primitives.
- `MiniLMEmbeddings`: `Embeddings` over a `SentenceTransformerEmbedder`; each query alone.
- `PgVectorCollection`: a read-only `VectorStore` over one collection of a `PgVectorStore`.

Sync methods run the engines' async calls with `asyncio.run` (LangChain calls them from
worker threads without a running loop). How Teola runs them natively: `teola.demo.native`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict

from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_langchain.components.prompts import PromptPrefix

OnCall = Callable[[str, float, float], None]  # (kind, began, ended), time.perf_counter seconds

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


def render_chat_prefix(prefix: PromptPrefix) -> str:
    """The ChatML text of a prompt's ready start: its whole messages, then the open one unclosed."""
    text = "".join(f"<|im_start|>{chat_role(_role_of(m))}\n{m.text}<|im_end|>\n" for m in prefix.messages)
    if prefix.open_role is not None:
        text += f"<|im_start|>{chat_role(prefix.open_role)}\n{prefix.open_text}"
    return text


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
    """MiniLM through a `SentenceTransformerEmbedder`: documents in one call, each query alone.

    on_call(kind, began, ended): told the `time.perf_counter` span of every call ("embed").
    """

    def __init__(self, embedder: Any, on_call: OnCall | None = None) -> None:
        self.embedder = embedder
        self.on_call = on_call

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        with _reported(self.on_call, "embed"):
            return self.embedder.encode(texts, "document").tolist()

    def embed_query(self, text: str) -> list[float]:
        with _reported(self.on_call, "embed"):
            return self.embedder.encode([text], "query")[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        with _reported(self.on_call, "embed"):
            return (await self.embedder.encode_async(texts, "document")).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        with _reported(self.on_call, "embed"):
            return (await self.embedder.encode_async([text], "query"))[0].tolist()


class PgVectorCollection(VectorStore):
    """One collection of a `PgVectorStore`, searched by cosine distance (read-only here).

    on_call(kind, began, ended): told the `time.perf_counter` span of every search ("search").
    """

    def __init__(self, store: Any, collection: str, embeddings: Embeddings, on_call: OnCall | None = None) -> None:
        self.store = store
        self.collection = collection
        self.on_call = on_call
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
        with _reported(self.on_call, "search"):
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


@contextmanager
def _reported(on_call: OnCall | None, kind: str) -> Iterator[None]:
    began = time.perf_counter()
    try:
        yield
    finally:
        if on_call is not None:
            on_call(kind, began, time.perf_counter())
