"""Tracing: which graph known chain shapes become, and how their data is wired."""

from __future__ import annotations

import warnings
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.output_parsers import JsonOutputParser, NumberedListOutputParser, StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import (
    Runnable,
    RunnableBranch,
    RunnableConfig,
    RunnableLambda,
    RunnablePassthrough,
    RunnableSequence,
)
from lc_fakes import EchoChat, format_docs, make_store

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_core.ir.prompt import PromptPlan
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_langchain import OpaqueStepWarning, TeolaRunnable, optimize
from teola_langchain.components.parsers import ParserItems

K = PrimitiveKind
STORE = make_store()
PROMPT = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "Q: {question}\nC: {context}")])


def kinds(graph: Graph) -> list[PrimitiveKind]:
    return [n.kind for n in graph.nodes.values() if n.kind not in (K.INPUT, K.OUTPUT)]


def only(graph: Graph, kind: PrimitiveKind) -> Any:
    (node,) = [n for n in graph.nodes.values() if n.kind == kind]
    return node


def names(graph: Graph) -> list[str]:
    return [n.id for n in graph.nodes.values() if n.kind == K.CALL]


def traced(chain: Any, **options: Any) -> TeolaRunnable[Any, Any]:
    fast = optimize(chain, passes=False, **options)
    fast.close()
    return fast


def test_a_sequence_opens_and_closes_its_run_around_its_steps() -> None:
    chain = PromptTemplate.from_template("About {topic}") | EchoChat() | StrOutputParser()
    graph = traced(chain).plan.main.pgraph
    calls = names(graph)
    assert calls[0] == "RunnableSequence.open" and calls[-1] == "RunnableSequence.close"
    assert "PromptTemplate.invoke" in calls and "StrOutputParser.invoke" in calls  # they run themselves
    assert [k for k in kinds(graph) if k is not K.CALL] == [K.PREFILL, K.DECODE]
    assert only(graph, K.DECODE).engine == "llm:EchoChat"


def test_retriever_becomes_embed_and_search_inside_its_run() -> None:
    retriever = STORE.as_retriever(search_kwargs={"k": 3})
    graph = traced(retriever).plan.main.pgraph
    assert [k for k in kinds(graph) if k is not K.CALL] == [K.EMBED, K.SEARCH]
    embed, search = only(graph, K.EMBED), only(graph, K.SEARCH)
    assert embed.engine == "embed:DeterministicFakeEmbedding"
    assert search.engine == "vectordb:InMemoryVectorStore"
    assert search.config["top_k"] == 3 and search.config["search_kwargs"] == {"k": 3}
    assert {"VectorStoreRetriever.start", "VectorStoreRetriever.end"} <= set(names(graph))


def test_retriever_map_embeds_the_whole_list() -> None:
    graph = traced(RunnableLambda(str.split) | STORE.as_retriever().map()).plan.main.pgraph
    assert only(graph, K.EMBED).items is None
    assert only(graph, K.SEARCH).config["top_k"] == 4  # InMemoryVectorStore's default k


def test_a_list_parser_before_a_map_pipelines_when_items_are_expected() -> None:
    chain = PromptTemplate.from_template("{q}") | EchoChat(style="json_list") | JsonOutputParser()
    graph = traced(chain | STORE.as_retriever().map(), expected_items=3).plan.main.pgraph
    decode = only(graph, K.DECODE)
    assert isinstance(decode.config["split_unit"], ParserItems) and decode.config["expected_items"] == 3
    assert "JsonOutputParser.invoke" in names(graph)  # the parser still runs, on the whole output
    start = graph.nodes["VectorStoreRetriever.start"]
    assert {(e.src, e.src_port) for e in graph.data_in(start.id) if e.dst_port == "items"} == {(decode.id, "items")}
    without_hint = traced(chain | STORE.as_retriever().map()).plan.main.pgraph
    assert "split_unit" not in only(without_hint, K.DECODE).config


def test_rag_prompt_plan_names_where_each_variable_comes_from() -> None:
    retriever = STORE.as_retriever(search_kwargs={"k": 2})
    chain = (
        {"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
        | PROMPT
        | EchoChat()
    )
    graph = traced(chain).plan.main.pgraph
    plan = only(graph, K.PREFILL).config["prompt_plan"]
    assert isinstance(plan, PromptPlan)
    question, context = plan.source("question"), plan.source("context")
    assert question is not None and question[0].startswith("RunnableLambda.invoke")  # the itemgetter, run as itself
    assert context is not None and graph.nodes[context[0]].label == "RunnableSequence"  # the branch's close
    # the prompt itself gets the whole dict, after the parallel's run ends
    (prompt_in,) = [e for e in graph.data_in("ChatPromptTemplate.invoke") if e.dst_port == "value"]
    # after the batch bookkeeping of a top-level step: the parallel's close
    assert [e.src for e in graph.data_in(prompt_in.src) if e.dst_port == "value"] == [
        "RunnableParallel<context,question>.close"
    ]


def test_assign_over_input_plans_its_fields_apart() -> None:
    chain = RunnablePassthrough.assign(context=itemgetter("question") | STORE.as_retriever() | format_docs) | PROMPT
    graph = traced(chain | EchoChat()).plan.main.pgraph
    plan = only(graph, K.PREFILL).config["prompt_plan"]
    question = plan.source("question")
    assert question is not None and graph.nodes[question[0]].config["fn"].__name__ == "get"


def test_branch_becomes_condition_guards_and_select() -> None:
    chain = RunnableBranch(
        (lambda x: x > 0, RunnableLambda(lambda x: x + 1)),
        (lambda x: x < 0, RunnableLambda(lambda x: x - 1)),
        RunnablePassthrough(),
    )
    graph = traced(chain, execution="graph").plan.main.pgraph
    condition = only(graph, K.CONDITION)
    aggregate = only(graph, K.AGGREGATE)
    assert aggregate.config["mode"] == MergeMode.SELECT and len(aggregate.inputs) == 3
    assert {c.branch for c in graph.control_out(condition.id)} == {0, 1, 2}


def test_map_of_a_chain_traces_its_body_as_a_nested_graph() -> None:
    body = PromptTemplate.from_template("{x}") | EchoChat() | StrOutputParser()
    fast = traced(RunnableLambda(lambda s: [{"x": w} for w in s.split()]) | body.map())
    (sub,) = fast.plan.subgraphs
    assert K.DECODE in kinds(sub.pgraph)
    assert fast.invoke("a b") == [body.invoke({"x": "a"}), body.invoke({"x": "b"})]


def test_model_binding_is_the_llm_step() -> None:
    bound = EchoChat().bind(stop=["x"])
    graph = traced(PromptTemplate.from_template("{q}") | bound).plan.main.pgraph
    assert only(graph, K.DECODE).config["step"].runnable is bound


class Custom(Runnable[int, int]):
    def invoke(self, input: int, config: RunnableConfig | None = None, **kwargs: Any) -> int:
        return input + 1


def test_unknown_step_runs_as_one_call_with_a_warning_naming_it() -> None:
    with pytest.warns(OpaqueStepWarning, match="Custom"):
        fast = optimize(RunnableLambda(lambda x: x) | Custom(), execution="graph")
    assert any("Custom" in o for o in fast.plan.opaque)
    assert fast.invoke(1) == 2
    fast.close()


def test_mmr_retriever_runs_as_one_call_and_says_why() -> None:
    with pytest.warns(OpaqueStepWarning, match="search_type 'mmr'"):
        fast = optimize(STORE.as_retriever(search_type="mmr"))
    assert K.EMBED not in kinds(fast.plan.main.pgraph)
    fast.close()


def test_lambdas_retries_and_fallbacks_run_themselves_without_warning() -> None:
    chain = RunnableLambda(lambda x: x).with_retry() | RunnableLambda(lambda x: x).with_fallbacks(
        [RunnablePassthrough()]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueStepWarning)
        fast = optimize(chain)
    assert fast.plan.opaque == []
    fast.close()


class MySequence(RunnableSequence):  # type: ignore[type-arg]
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return "mine"


def test_a_composite_whose_methods_were_replaced_runs_its_own_methods() -> None:
    chain = RunnableLambda(lambda x: x) | PromptTemplate.from_template("{q}") | EchoChat()
    subclassed = MySequence(*chain.steps)
    fast = optimize(subclassed, execution="graph")
    assert fast.invoke({"q": "a"}) == "mine"
    assert K.DECODE not in kinds(fast.plan.main.pgraph)
    fast.close()


def test_a_chain_with_nothing_for_the_engines_runs_as_langchain_runs_it() -> None:
    fast = optimize(RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2))
    assert not fast.on_graph and fast.invoke(1) == 4 and fast.calls_on_graph == 0
    assert "runs as LangChain runs it" in fast.explain()
    fast.close()


def test_explain_shows_execution_graphs_passes_and_mermaid() -> None:
    fast = optimize(PromptTemplate.from_template("{q}") | EchoChat() | StrOutputParser())
    text = fast.explain()
    for needle in ("== execution", "== p-graph", "== passes applied", "== e-graph", "flowchart TD", "llm:EchoChat"):
        assert needle in text
    fast.close()


def test_profiles_enable_prefill_split_and_decode_pipelining() -> None:
    profiles = {
        "llm:EchoChat": LatencyProfile("llm:EchoChat", {"prefill": Curve(((1, 0.01),)), "decode": Curve(((1, 0.01),))}),
        "embed:DeterministicFakeEmbedding": LatencyProfile(
            "embed:DeterministicFakeEmbedding", {"embed": Curve(((1, 0.01), (8, 0.02)))}
        ),
        "vectordb:InMemoryVectorStore": LatencyProfile(
            "vectordb:InMemoryVectorStore", {"search": Curve(((1, 0.01), (8, 0.02)))}
        ),
    }
    rag = RunnablePassthrough.assign(context=itemgetter("question") | STORE.as_retriever() | format_docs) | PROMPT
    fast = optimize(rag | EchoChat() | StrOutputParser(), profiles=profiles)
    e_kinds = kinds(fast.plan.main.graph)
    assert K.PARTIAL_PREFILL in e_kinds and K.FULL_PREFILL in e_kinds
    x = {"question": "why cats"}
    assert fast.invoke(x) == (rag | EchoChat() | StrOutputParser()).invoke(x)
    fast.close()

    expand = PromptTemplate.from_template("{q}") | EchoChat(style="numbered") | NumberedListOutputParser()
    chain = expand | STORE.as_retriever().map()
    fast = optimize(chain, profiles=profiles, expected_items=3)
    assert kinds(fast.plan.main.graph).count(K.PARTIAL_DECODE) == 3
    assert fast.invoke({"q": "cats"}) == chain.invoke({"q": "cats"})
    fast.close()
