"""Every example chain gives the same answers plain and optimized, against the servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel

import teola
from teola_adapters.simulated.servers import SimServers
from teola_benchmarks.langchain.bench import EXAMPLES, example_module
from teola_examples.common import HTTPReranker, corpus, openai_models


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_equal_plain_and_optimized(servers: SimServers, name: str) -> None:
    module = example_module(name)
    llm, embeddings = openai_models(servers.base_url)
    chain = module.build_chain(llm, embeddings, corpus=corpus(16), reranker=HTTPReranker(servers.base_url))
    fast = teola.optimize(chain, **module.OPTIMIZE_OPTIONS)
    inputs = module.inputs(3)

    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        plain = [await chain.ainvoke(x) for x in inputs]
        concurrent = await asyncio.gather(*(fast.ainvoke(x) for x in inputs))
        batched = await fast.abatch(inputs)
        return plain, list(concurrent), batched

    try:
        plain, concurrent, batched = asyncio.run(run())
    finally:
        fast.close()
    assert all(isinstance(a, str) and a for a in plain)
    assert concurrent == plain
    assert batched == plain


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_sync_invoke_equal(servers: SimServers, name: str) -> None:
    module = example_module(name)
    llm, embeddings = openai_models(servers.base_url)
    chain = module.build_chain(llm, embeddings, corpus=corpus(16), reranker=HTTPReranker(servers.base_url))
    fast = teola.optimize(chain, **module.OPTIMIZE_OPTIONS)
    try:
        for x in module.inputs(2):
            assert fast.invoke(x) == chain.invoke(x)
    finally:
        fast.close()


@pytest.mark.parametrize("execution", ["auto", "graph"])
def test_sync_invoke_after_asyncio_run(servers: SimServers, execution: str) -> None:
    """Sync calls use the models' and embeddings' sync APIs, as plain `invoke` does (langchain-openai's
    cached async client, last used under a closed `asyncio.run` loop, would fail)."""
    module = example_module("naive_rag")
    llm, embeddings = openai_models(servers.base_url)
    chain = module.build_chain(llm, embeddings, corpus=corpus(16))
    fast = teola.optimize(chain, execution=execution)
    x = module.inputs(1)[0]
    try:
        want = asyncio.run(chain.ainvoke(x))
        assert fast.invoke(x) == want
    finally:
        fast.close()


def test_multi_query_expansion_is_pipelined() -> None:
    """The expansion's lines reach retrieval as items (the decode-pipelining pass applied)."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from teola_benchmarks.langchain.fakes import ResponderChat

    module = example_module("multi_query_rag")
    chain = module.build_chain(ResponderChat(), DeterministicFakeEmbedding(size=16), corpus=corpus(8))
    fast = teola.optimize(chain, **module.OPTIMIZE_OPTIONS)
    assert "decode-pipelining" in "\n".join(fast.plan.main.passes)


def test_one_assign_runs_its_analyses_side_by_side_and_chained_assigns_start_early() -> None:
    """`.assign(a=, b=, c=)` runs its branches at once; of three chained `.assign`s, the later two
    read only "text" (their prompts' variables), so they start with the first (`early_steps.py`)."""
    import networkx as nx
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.runnables import RunnablePassthrough

    from teola_benchmarks.langchain.fakes import ResponderChat

    module = example_module("assign_pipeline")
    llm, parse = ResponderChat(), StrOutputParser()
    one = RunnablePassthrough.assign(
        summary=module.SUMMARY | llm | parse, facts=module.FACTS | llm | parse, tone=module.TONE | llm | parse
    ) | (module.BRIEF | llm | parse)
    graph = teola.optimize(one).plan.main.graph
    g = graph.to_networkx()
    kinds = {n.id: n.kind.value for n in _nodes(graph)}
    decodes = {i for i, k in kinds.items() if k == "decode"}
    upstream = {i: nx.ancestors(g, i) & decodes for i, k in kinds.items() if k == "prefill"}
    assert sorted(len(u) for u in upstream.values()) == [0, 0, 0, 3]
    chained = teola.optimize(module.build_chain(llm))
    assert [(note.step, note.early) for note in chained.plan.early] == [
        ("RunnableAssign<facts>[seq:step:2]", True),
        ("RunnableAssign<tone>[seq:step:3]", True),
    ]
    assert chained.on_graph and "dependency pruning" in chained.explain()
    chained.close()


def _nodes(graph: Any) -> list[Any]:
    nodes = graph.nodes
    return list(nodes.values()) if isinstance(nodes, dict) else list(nodes)


class _SometimesFails(BaseChatModel):
    """ResponderChat's answers, but a prompt whose digest is divisible by `every` fails: the
    same prompts fail plain and optimized, wherever in the chain they come."""

    every: int = 2

    @property
    def _llm_type(self) -> str:
        return "sometimes-fails"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        import hashlib

        from teola_benchmarks.langchain.fakes import ResponderChat

        text = "\n".join(m.text for m in messages)
        if int(hashlib.sha256(text.encode()).hexdigest(), 16) % self.every == 0:
            raise ValueError(f"the model failed on a prompt of {len(text)} characters")
        return ResponderChat()._generate(messages, stop, None, **kwargs)


def _traced(runnable: Any, mode: str, x: Any) -> tuple[str, Any, list[Any]]:
    """(status, output or error type, the finished trace trees) of one call with a tracer attached."""
    from teola_benchmarks.langchain.traces import TraceRecorder

    recorder = TraceRecorder()
    config = {"callbacks": [recorder]}
    try:
        out = runnable.invoke(x, config) if mode == "invoke" else asyncio.run(runnable.ainvoke(x, config))
        status, value = "ok", out
    except Exception as exc:
        status, value = "raised", type(exc)
    return status, value, recorder.trees()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_leaves_langchains_trace_even_when_a_step_fails_mid_chain(name: str, mode: str) -> None:
    """The trace contract on the shipped examples: outputs, errors and finished run trees equal
    plain LangChain's, sync and async, with model calls that fail mid-chain."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from teola_benchmarks.langchain.fakes import LocalReranker, ResponderChat

    module = example_module(name)
    parts = {"corpus": corpus(16), "reranker": LocalReranker()}
    embeddings = DeterministicFakeEmbedding(size=16)
    outcomes = {"ok": 0, "raised": 0}
    for model in (ResponderChat(), _SometimesFails()):
        chain = module.build_chain(model, embeddings, **parts)
        fast = teola.optimize(chain, **module.OPTIMIZE_OPTIONS)
        try:
            for x in module.inputs(6):
                expected, got = _traced(chain, mode, x), _traced(fast, mode, x)
                assert got == expected, x
                outcomes[expected[0]] += 1
        finally:
            fast.close()
    assert outcomes["ok"] and outcomes["raised"]  # both paths were compared
