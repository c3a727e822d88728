"""`teola.optimize` of the demo chain with its components on native engines.

    fast = optimize_native(chain, decode_batch=1)   # teola.optimize(chain, engines=native_engines(...))
    await fast.ainvoke({"question": "..."})

- a `ChatSmolLM` step runs on `NativeChatEngine`: the model's own `LlamaCppEngine` gets
  the PREFILL / PARTIAL_PREFILL / FULL_PREFILL / DECODE / PARTIAL_DECODE primitives of
  the prompt `render_chat` renders. The engine guarantees PARTIAL_PREFILL(prefix) +
  FULL_PREFILL(prompt) + DECODE = PREFILL(prompt) + DECODE (canonical chunks, greedy),
  so prefill split and decode pipelining change no token. The model's LangChain
  callbacks (on_llm_start/end) do not fire on this path.
- a `VectorStoreRetriever` over a `PgVectorCollection` becomes EMBED + SEARCH (its
  `similarity_search(q, k)` is `similarity_search_by_vector(embed_query(q), k)` by
  construction: `register_store_proof`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.prompt_values import PromptValue

from teola.demo.components import ChatSmolLM, PgVectorCollection, render_chat, render_chat_prefix
from teola_adapters._llm import LLM_KINDS
from teola_core.engines.choices import Chooser
from teola_core.engines.protocol import Call, CallResult, Engine
from teola_core.ir.kinds import PrimitiveKind
from teola_langchain.components import retrievers
from teola_langchain.components.prompts import PromptPrefix
from teola_langchain.engines import LangChainLLMEngine
from teola_langchain.runnable import TeolaRunnable


def _prompt_text(value: Any) -> str:
    if isinstance(value, PromptValue):
        return render_chat(value.to_messages())
    if isinstance(value, PromptPrefix):
        return render_chat_prefix(value)
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

    Every call is its own batch and all may be in flight at once: the llama.cpp engine does
    them earliest query first and steps at most `decode_batch` decodes together (default:
    as many of the ready decodes as the engine's measured step cost says, `planner.step_size`:
    the least mean latency where that costs nothing beyond stepping every ready decode
    together, else all of them).
    """

    kinds = LLM_KINDS

    def __init__(
        self,
        name: str,
        model: ChatSmolLM,
        fallback: Engine,
        replicas: Sequence[Any] = (),
        decode_batch: int | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.inner = model.engine
        self.instances = [model.engine, *replicas]
        self.fallback = fallback
        concurrency = sum(instance.limits.concurrency for instance in self.instances)
        self.limits = replace(self.inner.limits, max_batch_items=1, concurrency=concurrency)
        self.profile = self.inner.profile
        self.decode_batch = decode_batch  # None: each step's size from the measured step cost
        self._home: OrderedDict[str, int] = OrderedDict()  # query -> its instance (bounded)
        self._busy = [0] * len(self.instances)
        self._next = 0

    @property
    def _stepping(self) -> dict[str, Any]:
        return {"decode_batch": self.decode_batch, "by_cost": self.decode_batch is None}

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
        return replace(call, inputs={**call.inputs, port: _prompt_text(call.inputs[port])})

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
                outcomes = await self.instances[home].run([c for _, c in members], **self._stepping)
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
            async for delta in self.instances[home].stream(call, **self._stepping):
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


def native_engines(replicas: Sequence[Any] = (), decode_batch: int | None = None) -> Chooser:
    """The `engines=` choice that runs each `ChatSmolLM` of a chain on a `NativeChatEngine`.

    replicas: more `LlamaCppEngine`s loaded with the same model file and settings as the
      `ChatSmolLM`'s engine (the same computation, so the same greedy text); each query's
      calls stay on one instance (its KV states are there), queries spread over them.
    Other components keep Teola's default engines. The engines are chosen while the chain
    is traced, so the passes plan with the native engines' profiles.
    """

    def choose(component: Any, default: Engine) -> Engine | None:
        if type(component) is ChatSmolLM and isinstance(default, LangChainLLMEngine):
            instances = _same_model(component.engine, replicas)
            return NativeChatEngine(default.name, component, default, instances, decode_batch)
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


def optimize_native(
    runnable: Any, *, replicas: Sequence[Any] = (), decode_batch: int | None = None, **options: Any
) -> TeolaRunnable[Any, Any]:
    """`teola.optimize(runnable, engines=native_engines(replicas, decode_batch), **options)`, with
    the store proof registered (a `TeolaRunnable` directly: such a chain is never a LangGraph agent)."""
    register_store_proof()
    return TeolaRunnable(runnable, engines=native_engines(replicas, decode_batch), **options)
