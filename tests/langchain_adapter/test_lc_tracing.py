"""Tracing: which primitives known chain shapes become, and how their data is wired."""

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
)
from lc_fakes import EchoChat, format_docs, make_store

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PrimitiveKind
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_langchain import OpaqueStepWarning, TeolaRunnable, optimize
from teola_langchain.parsers import ParserItems
from teola_langchain.prompts import LangChainPrompt

K = PrimitiveKind
STORE = make_store()
PROMPT = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "Q: {question}\nC: {context}")])


def kinds(graph: Graph) -> list[PrimitiveKind]:
    return [n.kind for n in graph.nodes.values() if n.kind not in (K.INPUT, K.OUTPUT)]


def only(graph: Graph, kind: PrimitiveKind) -> Any:
    (node,) = [n for n in graph.nodes.values() if n.kind == kind]
    return node


def traced(chain: Any, **options: Any) -> TeolaRunnable[Any, Any]:
    fast = optimize(chain, passes=False, **options)
    fast.close()
    return fast


def test_retriever_becomes_embed_and_search() -> None:
    retriever = STORE.as_retriever(search_kwargs={"k": 3})
    graph = traced(retriever).plan.main.pgraph
    assert [k for k in kinds(graph) if k not in (K.CALL,)] == [K.EMBED, K.SEARCH]
    embed, search = only(graph, K.EMBED), only(graph, K.SEARCH)
    assert embed.engine == "embed:DeterministicFakeEmbedding"
    assert search.engine == "vectordb:InMemoryVectorStore"
    assert search.config["top_k"] == 3 and search.config["search_kwargs"] == {"k": 3}
    assert embed.items == 1 and search.items == 1


def test_retriever_map_embeds_the_whole_list() -> None:
    graph = traced(RunnableLambda(str.split) | STORE.as_retriever().map()).plan.main.pgraph
    embed = only(graph, K.EMBED)
    assert embed.items is None
    assert only(graph, K.SEARCH).config["top_k"] == 4  # InMemoryVectorStore's default k


def test_prompt_model_list_parser_is_format_prefill_decode_with_split_unit() -> None:
    chain = PromptTemplate.from_template("List {topic}") | EchoChat(style="numbered") | NumberedListOutputParser()
    graph = traced(chain).plan.main.pgraph
    assert kinds(graph) == [K.CALL, K.FORMAT, K.PREFILL, K.DECODE]  # CALL: the prompt's input split
    decode = only(graph, K.DECODE)
    assert isinstance(decode.config["split_unit"], ParserItems)
    assert decode.caps.splittable and decode.output_port("items") is not None
    (out_edge,) = graph.data_in(graph.output_node.id)
    assert (out_edge.src, out_edge.src_port) == (decode.id, "items")
    assert isinstance(only(graph, K.FORMAT).config["template"], LangChainPrompt)


def test_str_parser_needs_no_split_unit() -> None:
    chain = PromptTemplate.from_template("About {topic}") | EchoChat() | StrOutputParser()
    graph = traced(chain).plan.main.pgraph
    decode = only(graph, K.DECODE)
    assert "split_unit" not in decode.config and not decode.caps.splittable


def test_json_parser_before_a_map_gets_items() -> None:
    chain = (
        PromptTemplate.from_template("{q}")
        | EchoChat(style="json_list")
        | JsonOutputParser()
        | STORE.as_retriever().map()
    )
    graph = traced(chain).plan.main.pgraph
    decode = only(graph, K.DECODE)
    assert isinstance(decode.config["split_unit"], ParserItems)
    (edge,) = graph.data_in(only(graph, K.EMBED).id)
    assert (edge.src, edge.src_port) == (decode.id, "items")


def test_rag_prompt_variables_come_from_their_own_producers() -> None:
    retriever = STORE.as_retriever(search_kwargs={"k": 2})
    chain = (
        {"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
        | PROMPT
        | EchoChat()
    )
    graph = traced(chain).plan.main.pgraph
    fmt = only(graph, K.FORMAT)
    sources = {e.dst_port: graph.nodes[e.src] for e in graph.data_in(fmt.id)}
    assert sources["question"].kind == K.CALL and sources["question"].label == "itemgetter('question')"
    assert sources["context"].label == "format_docs"
    # the question does not wait for retrieval: its producer reads the graph input directly
    (q_in,) = graph.data_in(sources["question"].id)
    assert graph.nodes[q_in.src].kind == K.INPUT


def test_assign_over_input_keeps_fields_apart() -> None:
    chain = RunnablePassthrough.assign(context=itemgetter("question") | STORE.as_retriever() | format_docs) | PROMPT
    graph = traced(chain).plan.main.pgraph
    fmt = only(graph, K.FORMAT)
    producers = {e.dst_port: e.src for e in graph.data_in(fmt.id)}
    assert graph.nodes[producers["question"]].config["fn"].__name__ == "get"  # picked from the checked input
    assert graph.nodes[producers["context"]].label == "format_docs"


def test_branch_becomes_condition_guards_and_select() -> None:
    chain = RunnableBranch(
        (lambda x: x > 0, RunnableLambda(lambda x: x + 1)),
        (lambda x: x < 0, RunnableLambda(lambda x: x - 1)),
        RunnablePassthrough(),
    )
    graph = traced(chain).plan.main.pgraph
    condition = only(graph, K.CONDITION)
    aggregate = only(graph, K.AGGREGATE)
    assert aggregate.config["mode"] == MergeMode.SELECT and len(aggregate.inputs) == 3
    guards = sorted(c.branch for c in graph.control_out(condition.id))
    assert set(guards) == {0, 1, 2}


def test_map_of_a_chain_traces_its_body_as_a_nested_graph() -> None:
    body = PromptTemplate.from_template("{x}") | EchoChat() | StrOutputParser()
    fast = traced(RunnableLambda(lambda s: [{"x": w} for w in s.split()]) | body.map())
    (sub,) = fast.plan.subgraphs
    assert K.DECODE in kinds(sub.pgraph)
    assert fast.invoke("a b") == [body.invoke({"x": "a"}), body.invoke({"x": "b"})]


def test_model_binding_is_the_llm_step() -> None:
    bound = EchoChat().bind(stop=["x"])
    graph = traced(PromptTemplate.from_template("{q}") | bound).plan.main.pgraph
    assert only(graph, K.DECODE).config["runnable"] is bound


class Custom(Runnable[int, int]):
    def invoke(self, input: int, config: RunnableConfig | None = None, **kwargs: Any) -> int:
        return input + 1


def test_unknown_step_runs_opaque_with_a_warning_naming_it() -> None:
    with pytest.warns(OpaqueStepWarning, match="Custom"):
        fast = optimize(RunnableLambda(lambda x: x) | Custom())
    assert any("Custom" in o for o in fast.plan.opaque)
    assert fast.invoke(1) == 2
    fast.close()


def test_mmr_retriever_stays_opaque_and_says_why() -> None:
    with pytest.warns(OpaqueStepWarning, match="search_type 'mmr'"):
        fast = optimize(STORE.as_retriever(search_type="mmr"))
    assert K.EMBED not in kinds(fast.plan.main.pgraph)
    fast.close()


def test_by_design_opaque_steps_do_not_warn() -> None:
    chain = RunnableLambda(lambda x: x).with_retry() | RunnableLambda(lambda x: x).with_fallbacks(
        [RunnablePassthrough()]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueStepWarning)
        fast = optimize(chain)
    assert len(fast.plan.opaque) == 2
    fast.close()


def test_explain_shows_graphs_passes_and_mermaid() -> None:
    fast = optimize(PromptTemplate.from_template("{q}") | EchoChat() | StrOutputParser())
    text = fast.explain()
    for needle in ("== p-graph", "== passes applied", "== e-graph", "flowchart TD", "llm:EchoChat", "== stream"):
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
