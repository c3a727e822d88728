"""The user's own LangChain components, run as Teola engines.

By default an optimized chain runs on what the user built: the chat model or LLM, the
embeddings and the vector store of the original chain. Each component object gets one
engine (by identity), so every step and every query that uses it shares its engine
scheduler, which is what lets calls from concurrent queries batch.

- `LangChainLLMEngine`: decode calls the step's runnable — the model, or the
  `RunnableBinding` around it — with `ainvoke(prompt, config)`, the query's config
  merged with the bindings' as LangChain merges them; a streamed decode (decode
  pipelining) uses `astream` and yields the chunks' text. A LangChain model has no
  prefill API: PREFILL and FULL_PREFILL record the prompt (the model's own request
  prefills it). PARTIAL_PREFILL warms the model's server when the engine has a
  `PrefixWarmer` — by default for a langchain-openai `ChatOpenAI`/`OpenAI` with a
  `base_url` (a vLLM server: `prefix_warmup.py`) — and is bookkeeping otherwise. The
  answer is the model's own either way. Such a model's engine also learns its server's
  bound from the server's `/metrics` (`teola_adapters.server_load.ServerLoadWatch`):
  calls beyond what the server runs wait in Teola's engine scheduler, earliest query
  first, not in the server's queue; a server without vLLM's gauges is never held.
- `LangChainEmbeddingEngine`: `aembed_query` per text, or one `aembed_documents` for a
  whole batch when `retrievers.batchable_embeddings` proves it equal.
- `LangChainVectorStoreEngine`: `asimilarity_search_by_vector(v, **search_kwargs)` per
  vector; for a store whose sync and async searches are different code
  (`retrievers.follows_mode`, e.g. langchain-postgres's `PGVector`), a query made
  through a sync method searches with `similarity_search_by_vector` in a worker thread,
  as LangChain's sync path does.
- `LangChainRerankEngine`: a `ContextualCompressionRetriever`'s compressor
  (`components/compression.py`): its own `compress_documents` (sync query, worker thread)
  or `acompress_documents` per call; one `model.score` for the calls of a batch only when
  the cross encoder's class is registered per-pair (`compression.scores_per_pair`).

Which engine runs a component can be chosen: `EngineChoices`, the `engines=` option of
`teola.optimize`.

Every engine returns one result per call; an exception fails that call only.

Engines that send each call on its own (the model, per-query embeddings, the store)
take one call per batch (`max_batch_items=1`, many batches at once): a batch's calls
all complete when its slowest does, so grouping calls that are not computed together
would only make the fast ones wait (measured: naive RAG 0.85x of LangChain against a
single-instance embedding server before this, as the queries' embeddings returned
together). Only the proven `aembed_documents` path and registered per-pair cross
encoders batch across queries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseLanguageModel
from langchain_core.vectorstores import VectorStore

from teola_adapters.server_load import ServerLoadWatch
from teola_adapters.vllm_http import PrefixWarmer
from teola_core.engines.choices import ComponentEngines, EngineOption
from teola_core.engines.choices import EngineChoices as CoreEngineChoices
from teola_core.engines.opaque_llm import OpaqueModelEngine
from teola_core.engines.protocol import (
    Call,
    CallResult,
    Engine,
    EngineLimits,
    JointCallEngine,
    PerCallEngine,
    StreamResult,
)
from teola_core.ir.kinds import LLM_KINDS, PrimitiveKind
from teola_langchain.components import compression
from teola_langchain.components.parsers import ParserItems
from teola_langchain.components.retrievers import batchable_embeddings, follows_mode
from teola_langchain.execution import runs
from teola_langchain.execution.context import QueryContext, StepRef
from teola_langchain.execution.steps import ModelStep
from teola_langchain.prefix_warmup import render, server_root, warmer_for


class LangChainLLMEngine(OpaqueModelEngine):
    """A LangChain chat model or LLM (see the module docstring)."""

    limits = EngineLimits(concurrency=64, max_batch_items=1)  # one call per batch: see the module docstring

    def __init__(
        self,
        name: str,
        model: BaseLanguageModel[Any],
        warmer: PrefixWarmer | None = None,
        load_watch: ServerLoadWatch | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.warmer = warmer
        self.load_watch = load_watch

    def with_warmer(self, warmer: PrefixWarmer | None) -> LangChainLLMEngine:
        """The same model's engine, warming prefixes with `warmer` (None: not at all)."""
        return LangChainLLMEngine(self.name, self.model, warmer, self.load_watch)

    async def run_call(self, call: Call) -> dict[str, Any]:
        if call.node.kind == PrimitiveKind.PARTIAL_PREFILL and self.warmer is not None and not self.warmer.stopped:
            # Returns once the warm-up is sent, not answered: the model's request queues behind it.
            await self.warmer.start(render(self.model, self._step(call).runnable, call.inputs["prefix"]))
        return await super().run_call(call)

    async def generate(self, call: Call, prompt: Any) -> Any:
        step = self._step(call)
        return await runs.invoke_step(_query(call), step.ref, step.runnable, prompt)

    def decode_outputs(self, call: Call, output: Any) -> dict[str, Any]:
        unit = call.node.config.get("split_unit")
        if isinstance(unit, ParserItems):  # the parser's own result from the model output
            return {"text": output, "items": unit.parse_output(output)}
        return super().decode_outputs(call, output)

    async def stream(self, call: Call) -> AsyncIterator[str | StreamResult]:
        """The model's own call, its text as it is generated (decode pipelining): `runs.invoke_streaming`."""
        step = self._step(call)
        async for delta in runs.invoke_streaming(_query(call), step.ref, step.runnable, self.prompt_of(call)):
            yield delta

    @staticmethod
    def _step(call: Call) -> ModelStep:
        return call.node.config["step"]


def _query(call: Call) -> QueryContext:
    """The query's LangChain context (`Call.context`), which every framework engine needs."""
    if not isinstance(call.context, QueryContext):
        raise TypeError(
            f"{call.node.describe()}: a LangChain component's engine needs the query's context "
            f"(got {type(call.context).__name__}); run the graph through the optimized runnable"
        )
    return call.context


class LangChainEmbeddingEngine(Engine):
    """A LangChain `Embeddings` object (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.EMBED})
    limits = EngineLimits(concurrency=16)
    driver_only = True  # calls the app's own object with each query's mode: never in a Ray actor

    def __init__(self, name: str, embeddings: Embeddings) -> None:
        self.name = name
        self.embeddings = embeddings
        self.batches_queries = batchable_embeddings(embeddings)
        if not self.batches_queries:
            self.limits = EngineLimits(concurrency=16, max_batch_items=1)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Each query's texts through the API its caller used: sync methods (in worker
        threads) for a sync call, async ones otherwise, as LangChain's retriever does."""
        results: list[CallResult] = [{} for _ in calls]
        for sync in (True, False):
            part = [i for i, c in enumerate(calls) if _query(c).sync is sync]
            if not part:
                continue
            texts = [list(calls[i].inputs["texts"]) for i in part]
            if self.batches_queries:
                done = await self._together(texts, sync)
            else:
                done = list(await asyncio.gather(*(self._each(ts, sync) for ts in texts), return_exceptions=True))
            for i, result in zip(part, done, strict=True):
                results[i] = result
        return results

    async def _together(self, texts: list[list[str]], sync: bool) -> list[CallResult]:
        """One `embed_documents` for every query of the batch (proven equal: `batchable_embeddings`)."""
        flat = [t for ts in texts for t in ts]
        try:
            if not flat:
                vectors: list[Any] = []
            elif sync:
                vectors = await asyncio.to_thread(self.embeddings.embed_documents, flat)
            else:
                vectors = await self.embeddings.aembed_documents(flat)
        except Exception as exc:
            return [_own_copy(exc) for _ in texts]
        results: list[CallResult] = []
        start = 0
        for ts in texts:
            results.append({"vectors": vectors[start : start + len(ts)]})
            start += len(ts)
        return results

    async def _each(self, texts: list[str], sync: bool) -> dict[str, Any]:
        if sync:
            vectors = await asyncio.gather(*(asyncio.to_thread(self.embeddings.embed_query, t) for t in texts))
        else:
            vectors = await asyncio.gather(*(self.embeddings.aembed_query(t) for t in texts))
        return {"vectors": list(vectors)}


def _own_copy(exc: Exception) -> Exception:
    """The error of a batch, once per query (each query's caller may add to its own)."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:
        return exc
    copy.__cause__ = exc
    return copy


class LangChainVectorStoreEngine(PerCallEngine):
    """A LangChain `VectorStore`: similarity search by vector (see the module docstring)."""

    kinds = frozenset({PrimitiveKind.SEARCH})
    limits = EngineLimits(concurrency=16, max_batch_items=1)
    driver_only = True

    def __init__(self, name: str, store: VectorStore) -> None:
        self.name = name
        self.store = store
        self.follows_mode = follows_mode(store)

    async def run_call(self, call: Call) -> dict[str, Any]:
        kwargs = dict(call.node.config.get("search_kwargs", {}))
        vectors = call.inputs["vectors"]
        if _query(call).sync:  # the sync API, as LangChain's sync path calls it
            search = self.store.similarity_search_by_vector
            hits = await asyncio.gather(*(asyncio.to_thread(search, v, **kwargs) for v in vectors))
        else:
            hits = await asyncio.gather(*(self.store.asimilarity_search_by_vector(v, **kwargs) for v in vectors))
        return {"hits": list(hits)}


class LangChainRerankEngine(JointCallEngine):
    """A `ContextualCompressionRetriever`'s compressor as a RERANK engine (see the module docstring).

    A call is one query's `compress_documents(docs, query, callbacks=...)` (the node's
    config names the retriever run it is made in: `ref`); with no documents it makes no
    call and gives `[]`, as the retriever does. Several calls share one `model.score` only
    when `compression.scores_per_pair` proves it: the calls queued behind a running one
    form the next batch; if the joint call raises, each call runs alone (and fails alone).
    """

    kinds = frozenset({PrimitiveKind.RERANK})
    driver_only = True  # calls the app's compressor with each query's callbacks and mode

    def __init__(self, name: str, compressor: Any) -> None:
        super().__init__()
        self.name = name
        self.compressor = compressor
        self.joint = compression.scores_per_pair(compressor)
        # A joint call is one model call: one at a time, the calls that queue meanwhile form the next.
        self.limits = EngineLimits(concurrency=1 if self.joint else 16, max_batch_items=None if self.joint else 1)

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Calls without documents give `[]` at once; the others run (jointly where proven)."""
        results: list[CallResult] = [{"docs": []} for _ in calls]
        todo = [i for i, c in enumerate(calls) if c.inputs["docs"]]
        for i, result in zip(todo, await super().run([calls[i] for i in todo]), strict=True):
            results[i] = result
        return results

    async def run_call(self, call: Call) -> dict[str, Any]:
        """The compressor's own call, with the callbacks and mode of the query's retriever run."""
        docs, query, c = call.inputs["docs"], call.inputs["query"], self.compressor
        out = await runs.in_step(
            _query(call),
            self._ref(call),
            lambda config: c.compress_documents(docs, query, callbacks=config.get("callbacks")),
            lambda config: c.acompress_documents(docs, query, callbacks=config.get("callbacks")),
        )
        return {"docs": out}

    async def run_jointly(self, calls: Sequence[Call]) -> list[CallResult]:
        """One `score` over every call's pairs, then each call's own `compress_documents` on
        its part of the scores."""
        asked = [compression.pairs_of(c.inputs["query"], c.inputs["docs"]) for c in calls]
        flat = [p for pairs in asked for p in pairs]
        scores = await asyncio.to_thread(self.compressor.model.score, flat)
        if len(scores) != len(flat):
            raise ValueError(f"{self.name}: score returned {len(scores)} scores for {len(flat)} pairs")
        results: list[CallResult] = []
        start = 0
        for call, pairs in zip(calls, asked, strict=True):
            given = compression.with_scores(self.compressor, pairs, scores[start : start + len(pairs)])
            start += len(pairs)
            callbacks = _query(call).step_config(self._ref(call)).get("callbacks")
            try:
                docs = given.compress_documents(call.inputs["docs"], call.inputs["query"], callbacks=callbacks)
            except Exception as exc:
                results.append(exc)
            else:
                results.append({"docs": docs})
        return results

    @staticmethod
    def _ref(call: Call) -> StepRef:
        return call.node.config["ref"]


# What an engine must run for each role a component can have in a traced chain.
ROLE_KINDS: dict[str, frozenset[PrimitiveKind]] = {
    "llm": LLM_KINDS,
    "embed": frozenset({PrimitiveKind.EMBED}),
    "vectordb": frozenset({PrimitiveKind.SEARCH}),
    "rerank": frozenset({PrimitiveKind.RERANK}),
}


class EngineChoices(CoreEngineChoices):
    """The `engines=` option of `teola.optimize`: which Teola engine runs a component of the chain.

    The option (`teola_core.engines.choices`) is `(component, engine)` pairs matched by
    identity (a list: LangChain's models and embeddings are pydantic objects, which are
    not hashable), or a function `choose(component, default) -> engine | None` asked for
    every model, embeddings object, vector store and compressor the chain uses.

    The engine runs every primitive of that component (all queries share it), so it must
    run the primitives of the component's role (`ROLE_KINDS`) with the values Teola's
    own LangChain engines take and give: an LLM's prompts are LangChain prompt values
    (`PromptPrefix` for a partial prefill) and its DECODE `text` is what the model's
    `invoke` returns; EMBED `texts` -> `vectors`; SEARCH `vectors` -> `hits` (lists of
    LangChain `Document`s); a compressor's RERANK `query`, `docs` -> `docs` (what its
    `compress_documents` returns; the query's `QueryContext` is `Call.context`). What it
    computes is then the chain's result: Teola cannot check it against the component.

    One engine is made to keep LangChain's results by construction: a `VLLMHTTPEngine`
    given for a language model. The model keeps making its own calls (the answer is
    LangChain's), and Teola's prefix warm-ups go to that engine's vLLM server, with that
    engine's settings (block size, timeouts, retries, client). This is what Teola does by
    default for a langchain-openai model with a `base_url`; give the engine to name
    another server or settings, or turn the warm-ups off with a chooser.

        fast = teola.optimize(chain, engines=[(llm, VLLMHTTPEngine(url, "my-model", block_size=128))])
        no_warm_ups = lambda c, default: default.with_warmer(None) if isinstance(default, LangChainLLMEngine) else None
        fast = teola.optimize(chain, engines=no_warm_ups)
    """

    def __init__(self, option: EngineOption = None) -> None:
        super().__init__(option, ROLE_KINDS)

    def adapt(self, component: Any, role: str, default: Engine, chosen: Any) -> Engine | None:
        """A `VLLMHTTPEngine` given for a model: the model's engine, warming on that server."""
        if role == "llm" and isinstance(default, LangChainLLMEngine) and _is_vllm_http(chosen):
            return default.with_warmer(PrefixWarmer(chosen))
        return None


def _is_vllm_http(engine: object) -> bool:
    from teola_adapters.vllm_http.engine import VLLMHTTPEngine

    return isinstance(engine, VLLMHTTPEngine)


class EngineRegistry(ComponentEngines):
    """One engine per component object, named after its class; builds the `EngineSet`."""

    def __init__(self, choices: EngineChoices | None = None) -> None:
        super().__init__(choices or EngineChoices())

    def llm(self, model: BaseLanguageModel[Any]) -> str:
        def make(name: str) -> LangChainLLMEngine:
            root = server_root(model)
            if root is None:
                return LangChainLLMEngine(name, model)
            return LangChainLLMEngine(name, model, warmer_for(model), ServerLoadWatch(root))

        return self._get(model, "llm", make)

    def embeddings(self, embeddings: Embeddings) -> str:
        return self._get(embeddings, "embed", lambda name: LangChainEmbeddingEngine(name, embeddings))

    def vectorstore(self, store: VectorStore) -> str:
        return self._get(store, "vectordb", lambda name: LangChainVectorStoreEngine(name, store))

    def reranker(self, compressor: Any) -> str:
        """A `ContextualCompressionRetriever`'s compressor (`components/compression.py`)."""
        return self._get(compressor, "rerank", lambda name: LangChainRerankEngine(name, compressor))
