"""Latencies learned from a chain's own calls: keys, observation, re-planning, files, advice.

Times come from a virtual clock per thread (`ThreadClock`): a step "takes" what it adds
to its own thread's clock, so a test never sleeps and concurrent branches (other
threads) do not see each other's time.
"""

from __future__ import annotations

import asyncio
import threading
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import NumberedListOutputParser, StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableBranch, RunnableConfig, RunnableLambda, RunnablePassthrough
from lc_fakes import EchoChat, assert_equivalent, format_docs, make_store

from teola_core.ir.kinds import PrimitiveKind as K
from teola_core.profiles.learning import LatencyBook
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.runtime.timeline import SpanRecorder
from teola_langchain import optimize
from teola_langchain.components.parsers import LineListOutputParser
from teola_langchain.components.slices import SlicedItems, list_slice
from teola_langchain.planning.learning import Observer, observing

STORE = make_store()
PROMPT = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "Q: {question}\nC: {context}")])


class ThreadClock:
    """Seconds per thread: `spend` moves only the calling thread's clock."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return getattr(self._local, "now", 0.0)

    def spend(self, seconds: float) -> None:
        self._local.now = self() + seconds


class ClockedRetriever(BaseRetriever):
    """A user's own retriever that takes `cost` seconds of its thread's virtual clock."""

    clock: Any
    cost: float = 0.3

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        self.clock.spend(self.cost)
        return [Document(page_content=f"{query} note {i}") for i in range(2)]


def rag(retriever: Any, model: Any = None, prompt: Any = PROMPT) -> Any:
    fields = {"context": itemgetter("question") | retriever | format_docs, "question": itemgetter("question")}
    return fields | prompt | (model or EchoChat()) | StrOutputParser()


def kinds(fast: Any) -> list[K]:
    return [n.kind for sub in fast.plan.graphs() for n in sub.graph.nodes.values()]


# -- keys ----------------------------------------------------------------------------------
def key_chain() -> Any:
    branch = RunnableBranch(
        (lambda x: len(x["question"]) > 100, RunnableLambda(lambda x: "long")), itemgetter("question")
    )
    inner = (RunnablePassthrough.assign(topic=itemgetter("question")) | branch).with_config(run_name="Inner")
    expand = RunnableLambda(lambda x: [x["question"], x["question"] + "!"])
    return {"a": inner, "b": expand | STORE.as_retriever().map(), "c": itemgetter("question") | EchoChat()}


@pytest.mark.parametrize("execution", ["auto", "graph"])
def test_every_traced_step_is_observed_under_its_key(execution: str) -> None:
    fast = optimize(key_chain(), execution=execution)  # two calls: both observed
    fast.invoke({"question": "why cats"})
    fast.batch([{"question": "a"}, {"question": "b" * 120}])  # both branches run
    observed = {entry["key"] for entry in fast.learned.to_json()["latencies"]}  # type: ignore[index,union-attr]
    assert set(fast.plan.steps) <= observed, set(fast.plan.steps) - observed
    fast.close()


def test_the_callbacks_a_step_is_given_are_unchanged() -> None:
    seen: list[tuple[Any, ...]] = []

    def look(x: Any, config: RunnableConfig) -> Any:
        cbs = config["callbacks"]
        seen.append((type(cbs).__name__, [type(h).__name__ for h in cbs.handlers], len(cbs.inheritable_handlers)))
        return x

    chain = {"q": RunnableLambda(look), "c": itemgetter("q") | EchoChat()} | RunnableLambda(look)
    chain.invoke({"q": "x"})
    asyncio.run(chain.ainvoke({"q": "x"}))
    want, seen[:] = list(seen), []
    for execution in ("auto", "graph"):
        fast = optimize(chain, execution=execution)
        fast.invoke({"q": "x"})
        asyncio.run(fast.ainvoke({"q": "x"}))
        fast.close()
    assert seen == want * 2


# -- learning and re-planning -------------------------------------------------------------
def test_learning_finds_the_slow_retriever_and_plans_a_prefill_split() -> None:
    clock = ThreadClock()
    chain = rag(ClockedRetriever(clock=clock))
    fast = optimize(chain, warn=False)
    fast._replanner.clock = clock
    first = fast.plan
    assert K.PARTIAL_PREFILL not in kinds(fast)  # nothing known: every step is ready at once
    for i in range(3):
        assert fast.invoke({"question": f"q{i}"}) == chain.invoke({"question": f"q{i}"})
    assert fast.plan is not first and K.PARTIAL_PREFILL in kinds(fast)
    retriever = next(k for k in fast.plan.steps if k.endswith("ClockedRetriever[seq:step:2]"))
    assert fast.profiles[retriever].latency("run", 1) == pytest.approx(0.3)
    # EchoChat has no server to warm: the split is planned but running on the graph would not pay
    assert not fast.on_graph and "no server Teola can warm" in fast.explain()
    fast.close()


def test_a_long_ready_document_is_split_under_a_given_model_profile_once_its_length_is_learned() -> None:
    """With a model profile that has a per-step floor, a prefix of a few literal words does not
    pay for an early prefill; the user's document before the context does, once its length is known."""
    clock = ThreadClock()
    prompt = ChatPromptTemplate.from_messages([("human", "Doc: {document}\nC: {context}")])
    fields = {
        "context": itemgetter("question") | ClockedRetriever(clock=clock) | format_docs,
        "document": itemgetter("document"),
    }
    chain = fields | prompt | EchoChat() | StrOutputParser()
    floor = LatencyProfile("llm", {"prefill": Curve(((16, 0.020), (512, 0.140), (8192, 2.2)))})
    retriever = LatencyProfile("retriever", {"run": Curve(((1, 0.3),))})
    fast = optimize(chain, profiles={"llm:EchoChat": floor, "ClockedRetriever": retriever}, warn=False)
    fast._replanner.clock = clock
    assert K.PARTIAL_PREFILL not in kinds(fast)  # "Doc:": one word, not worth a step
    question = {"question": "q", "document": " ".join(["word"] * 1200)}
    for _ in range(3):
        assert fast.invoke(question) == chain.invoke(question)
    assert K.PARTIAL_PREFILL in kinds(fast)  # 1,200 words learned for {document}
    assert 1200 in fast.learned.words(3).values()
    fast.close()


def test_a_chain_without_engine_steps_learns_nothing() -> None:
    chain = RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2)
    fast = optimize(chain)
    assert [fast.invoke(i) for i in range(6)] == [chain.invoke(i) for i in range(6)]
    assert fast.learned.version == 0 and not fast.learned.to_json()["latencies"]
    assert fast.learn_after == 0 and "learning is off (no step runs on an engine" in fast.explain()
    fast.close()


def test_observation_backs_off_while_it_changes_no_plan() -> None:
    clock = ThreadClock()
    chain = rag(ClockedRetriever(clock=clock))
    fast = optimize(chain, warn=False)
    fast._replanner.clock = clock
    observed = []
    for _ in range(200):
        before = fast.learned.version
        fast.invoke({"question": "q"})
        observed.append(fast.learned.version != before)
    assert all(observed[:3])  # every call until the first learned plan
    assert sum(observed[3:100]) < 97 / 4  # then fewer than one in four ...
    assert 1 <= sum(observed[100:]) <= 100 / 32  # ... down to one in 64 (never none)
    fast.close()


class FirstSpan(SpanRecorder):
    """A span recorder whose `first` event is set by the first span (a runtime hook runs on
    the loop of the runtime, here the caller's)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = asyncio.Event()

    def on_span(self, span: Any) -> None:
        super().on_span(span)
        self.first.set()


def test_a_call_in_flight_keeps_the_plan_it_started_with() -> None:
    gate: dict[str, asyncio.Event] = {}

    async def wait(q: str) -> str:
        await gate["go"].wait()
        return q

    chain = rag(RunnableLambda(lambda q: q, afunc=wait) | RunnableLambda(lambda q: [Document(page_content=q)]))
    spans = FirstSpan()
    fast = optimize(chain, execution="graph", learn=1, hooks=[spans])
    old = fast.plan

    async def run() -> str:
        gate["go"] = asyncio.Event()
        call = asyncio.create_task(fast.ainvoke({"question": "cats"}))
        await spans.first.wait()  # the call has started on its graph
        for key in fast.plan.steps:  # meanwhile the chain learns that its retrieval is slow
            for _ in range(3):
                fast.learned.observe(key, "run", 1, 0.3 if "wait" in key or "RunnableLambda" in key else 0.0)
        fast._replanner.call_done()
        assert fast.plan is not old and K.PARTIAL_PREFILL in kinds(fast)
        gate["go"].set()
        return await call

    assert asyncio.run(run()) == chain.invoke({"question": "cats"})
    assert all(s.node is old.main.graph.nodes[s.node.id] for s in spans.spans)  # every node of the old plan
    fast.close()


def test_the_profiles_file_is_written_as_the_plan_learns_and_starts_the_next_one_warm(tmp_path) -> None:
    clock = ThreadClock()
    chain = rag(ClockedRetriever(clock=clock))
    path = tmp_path / "app.json"
    fast = optimize(chain, profiles=path, warn=False)
    fast._replanner.clock = clock
    for i in range(3):
        fast.invoke({"question": f"q{i}"})
    fast.close()
    assert path.exists() and LatencyBook.load(path).calls == 3
    warm = optimize(chain, profiles=path, warn=False)
    assert K.PARTIAL_PREFILL in kinds(warm)  # planned from the first call
    assert warm.invoke({"question": "q"}) == chain.invoke({"question": "q"})
    assert warm.save_profiles(tmp_path / "copy.json").exists()
    warm.close()
    with pytest.raises(ValueError, match="give a path"):
        optimize(chain, warn=False).save_profiles()


def test_a_profile_given_by_the_steps_own_name_plans_from_the_first_call() -> None:
    chain = rag(ClockedRetriever(clock=ThreadClock()))
    given = {"ClockedRetriever": LatencyProfile("ClockedRetriever", {"run": Curve(((1, 0.3),))})}
    fast = optimize(chain, profiles=given, warn=False)
    assert K.PARTIAL_PREFILL in kinds(fast)
    fast.close()
    twice = {"a": itemgetter("q") | EchoChat(), "b": itemgetter("q") | EchoChat()}
    with pytest.raises(ValueError, match="2 steps are named 'EchoChat'"):
        optimize(twice, profiles={"EchoChat": given["ClockedRetriever"]})


def test_the_number_of_items_a_model_writes_is_learned_for_decode_pipelining() -> None:
    expand = PromptTemplate.from_template("{q}") | EchoChat(style="lines", n_items=4) | LineListOutputParser()
    chain = expand | STORE.as_retriever(search_kwargs={"k": 1}).map()
    fast = optimize(chain)
    assert K.PARTIAL_DECODE not in kinds(fast)
    assert "expected_items=N" in fast.explain()
    for topic in ("cats", "dogs", "jazz"):
        assert fast.invoke({"q": topic}) == chain.invoke({"q": topic})
    assert kinds(fast).count(K.PARTIAL_DECODE) == 4
    assert fast.invoke({"q": "bread"}) == chain.invoke({"q": "bread"})
    fast.close()


# -- a proven list slice between the parser and the map ---------------------------------------
class Lookup(BaseRetriever):
    """A user's own retriever (runs through its own `invoke`)."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=f"about {query}")]


def sliced_chain() -> Any:
    expand = PromptTemplate.from_template("{q}") | EchoChat(style="numbered", n_items=5) | NumberedListOutputParser()
    return expand | RunnableLambda(lambda qs: qs[:3]) | Lookup().map()


def test_a_slice_step_keeps_pipelining_and_runs_as_langchain_runs_it() -> None:
    fast = optimize(sliced_chain(), expected_items=5, execution="graph")
    assert kinds(fast).count(K.PARTIAL_DECODE) == 3
    fast.close()
    assert_equivalent(sliced_chain, [{"q": "cats"}, {"q": "dogs"}], expected_items=5, modes=("invoke", "ainvoke"))


def test_only_provable_slices_are_slices() -> None:
    assert list_slice(RunnableLambda(lambda qs: qs[:3])) == slice(None, 3)
    assert list_slice(RunnableLambda(lambda qs: qs[1:])) == slice(1, None)
    n = 3
    for not_a_slice in (lambda qs: qs[-3:], lambda qs: qs[:n], lambda qs: list(qs)[:3], lambda qs: qs[::2]):
        assert list_slice(RunnableLambda(not_a_slice)) is None
    assert list_slice(RunnableLambda(lambda qs: qs[:3], afunc=lambda qs: qs[:3])) is None  # its own async path


def test_sliced_items_stream_exactly_the_slice() -> None:
    unit = SlicedItems(NumberedListOutputParser(), slice(1, 3))
    text = "Here:\n1. a\n2. b\n3. c\n4. d"
    parser, got = unit.parser(), []
    for ch in text:
        got += parser.feed(ch)
    assert got + parser.close() == unit.parse(text) == ["b", "c"]


# -- advice --------------------------------------------------------------------------------
def test_explain_says_what_blocks_and_what_was_learned() -> None:
    clock = ThreadClock()
    fast = optimize(rag(ClockedRetriever(clock=clock)), warn=False)
    fast._replanner.clock = clock
    text = fast.explain()
    assert "runs as one call" in text and "VectorStoreRetriever" in text and "not known yet" in text
    for i in range(3):
        fast.invoke({"question": f"q{i}"})
    text = fast.explain()
    assert "before anything was learned" in text and "300 ms (learned)" in text
    fast.close()
    expand = PromptTemplate.from_template("{q}") | EchoChat(style="lines") | LineListOutputParser()
    blocked = optimize(expand | RunnableLambda(lambda qs: sorted(qs)) | Lookup().map(), expected_items=3)
    assert "not a list slice Teola can prove" in blocked.explain()
    blocked.close()


def test_an_observer_outside_a_call_sees_nothing() -> None:
    book = LatencyBook()
    chain = rag(Lookup())
    chain.invoke({"question": "x"})
    assert book.to_json()["latencies"] == []
    with observing(Observer(book)):
        chain.invoke({"question": "x"})
    assert book.calls == 0 and book.to_json()["latencies"]


def test_a_chain_that_starts_as_langchain_runs_it_moves_to_the_graph_once_a_warm_up_pays() -> None:
    pytest.importorskip("langchain_openai")
    pytest.importorskip("uvicorn")
    from langchain_openai import ChatOpenAI

    from teola_adapters.simulated.servers import SimServers

    clock = ThreadClock()
    with SimServers(time_scale=0.01) as servers:
        llm = ChatOpenAI(base_url=servers.base_url, api_key="x", model="sim-7b", temperature=0, max_tokens=8)
        system = "You are a careful assistant for a documentation search engine. Answer in plain words. " * 3
        prompt = ChatPromptTemplate.from_messages([("system", system), ("human", "Q: {question}\nC: {context}")])
        chain = rag(ClockedRetriever(clock=clock), llm, prompt)
        fast = optimize(chain, warn=False)
        fast._replanner.clock = clock
        xs = [{"question": f"why {t}"} for t in ("cats", "dogs", "jazz", "chess")]
        try:
            got = [fast.invoke(x) for x in xs]
            assert got == [chain.invoke(x) for x in xs]
        finally:
            fast.close()
    assert fast.on_graph and fast.calls_on_graph == 1  # calls 1-3 ran as LangChain runs them, and taught it
    assert fast._engines.engines["llm:ChatOpenAI"].warmer.stats.warmups == 1


def test_teola_explain_prints_the_plan_of_module_attr(tmp_path, monkeypatch, capsys) -> None:
    from teola.cli import main

    (tmp_path / "my_app_for_explain.py").write_text(
        "from langchain_core.prompts import PromptTemplate\n"
        "from langchain_core.runnables import RunnableLambda\n"
        "chain = PromptTemplate.from_template('{q}') | RunnableLambda(lambda p: p.to_string())\n"
        "def build():\n"
        "    return chain\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "my_app_for_explain:chain"]) == 0
    out = capsys.readouterr().out
    assert "== execution ==" in out and "== what blocks a speedup" in out and "== p-graph" in out
    assert main(["explain", "my_app_for_explain:build", "--call"]) == 0
    assert "== expected time of one query alone" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="expected module:attr"):
        main(["explain", "my_app_for_explain"])
    with pytest.raises(SystemExit, match="no attribute"):
        main(["explain", "my_app_for_explain:nothing"])
