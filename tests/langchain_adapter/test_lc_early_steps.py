"""Dependency pruning in sequences: a step starts when the keys it reads are ready, and the finished
trace is LangChain's (`teola_langchain/tracing/early_steps.py`)."""

from __future__ import annotations

import asyncio
import re
import threading
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.language_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnablePassthrough
from langchain_core.runnables.passthrough import RunnablePick
from langchain_core.tracers.langchain import LangChainTracer
from lc_fakes import EchoChat, assert_equivalent, format_docs, make_store, outcome

from teola_langchain import optimize
from teola_langchain.components.reads import reads

STORE = make_store()
PARSE = StrOutputParser()


def ask(instruction: str) -> ChatPromptTemplate:
    return ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", instruction + ": {text}")])


def three_assigns(llm: Runnable[Any, Any] | None = None) -> Runnable[Any, Any]:
    """Three chained `.assign`s, each reading only "text", then a brief that reads all three."""
    llm = llm or EchoChat()
    brief = ChatPromptTemplate.from_template("Brief: {summary} / {facts} / {tone}")
    return (
        RunnablePassthrough.assign(summary=ask("summarize") | llm | PARSE)
        | RunnablePassthrough.assign(facts=ask("list facts") | llm | PARSE)
        | RunnablePassthrough.assign(tone=ask("tone") | llm | PARSE)
        | brief
        | llm
        | PARSE
    )


def retrieval_and_check(llm: Runnable[Any, Any] | None = None) -> Runnable[Any, Any]:
    """A retrieval beside an LLM check, written as two chained `.assign`s, then the answer."""
    llm = llm or EchoChat()
    check = ChatPromptTemplate.from_template("Is this a fair question? {question}")
    answer = ChatPromptTemplate.from_template("Q: {question}\nCheck: {check}\nContext: {context}")
    return (
        RunnablePassthrough.assign(context=itemgetter("question") | STORE.as_retriever() | format_docs)
        | RunnablePassthrough.assign(check=check | llm | PARSE)
        | answer
        | llm
        | PARSE
    )


TEXTS = [{"text": t} for t in ("cats and dogs", "rivers", "jazz in the evening")]
QUESTIONS = [{"question": q} for q in ("what about cats", "rivers?", "chess openings")]


# -- what a step reads ----------------------------------------------------------------
def test_reads_is_proven_from_the_step() -> None:
    prompt = ChatPromptTemplate.from_template("{a} and {b}")
    assert reads(prompt) == {"a", "b"}
    assert reads(PromptTemplate.from_template("{x}", partial_variables={"y": "1"})) == {"x", "y"}
    assert reads(itemgetter("q") | STORE.as_retriever()) == {"q"}  # only the first step sees the dict
    assert reads(RunnablePick(["a", "c"])) == {"a", "c"}
    assert reads(RunnableParallel(x=itemgetter("a"), y=prompt)) == {"a", "b"}
    assert reads(RunnableLambda(lambda d: d["a"])) is None  # a function may read anything
    assert reads(RunnableParallel(x=itemgetter("a"), y=RunnablePassthrough())) is None
    assert reads(EchoChat()) is None


def test_a_prompt_whose_invoke_was_replaced_reads_everything() -> None:
    prompt = ChatPromptTemplate.from_template("{a}")
    object.__setattr__(prompt, "invoke", lambda *a, **k: "mine")
    assert reads(prompt) is None


# -- which steps start early ----------------------------------------------------------
def early(chain: Runnable[Any, Any]) -> list[tuple[str, bool]]:
    fast = optimize(chain)
    fast.close()
    return [(note.step, note.early) for note in fast.plan.early]


def test_later_assigns_that_read_only_the_input_start_early() -> None:
    assert early(three_assigns()) == [
        ("RunnableAssign<facts>[seq:step:2]", True),
        ("RunnableAssign<tone>[seq:step:3]", True),
    ]
    assert early(retrieval_and_check()) == [("RunnableAssign<check>[seq:step:2]", True)]


def test_a_step_that_reads_the_step_ahead_waits_and_explain_says_why() -> None:
    chain = RunnablePassthrough.assign(summary=ask("summarize") | EchoChat() | PARSE) | RunnablePassthrough.assign(
        critique=ChatPromptTemplate.from_template("Critique: {summary}") | EchoChat() | PARSE
    )
    fast = optimize(chain)
    assert [(n.step, n.early) for n in fast.plan.early] == [("RunnableAssign<critique>[seq:step:2]", False)]
    assert "reads summary, which the step ahead writes" in fast.explain()
    fast.close()


def test_a_step_that_reads_its_whole_input_waits() -> None:
    chain = RunnablePassthrough.assign(summary=ask("summarize") | EchoChat() | PARSE) | RunnablePassthrough.assign(
        n=RunnableLambda(lambda d: len(d)) | EchoChat()
    )
    assert early(chain) == [("RunnableAssign<n>[seq:step:2]", False)]


def test_a_model_that_answers_in_call_order_keeps_its_order() -> None:
    fake = FakeListChatModel(responses=["a", "b", "c", "d"])
    assert early(three_assigns(fake)) == [
        ("RunnableAssign<facts>[seq:step:2]", False),
        ("RunnableAssign<tone>[seq:step:3]", False),
    ]


def test_a_step_with_callbacks_of_its_own_waits() -> None:
    own = EchoChat(callbacks=[LangChainTracer(client=_FakeClient())])
    chain = RunnablePassthrough.assign(summary=ask("summarize") | EchoChat() | PARSE) | RunnablePassthrough.assign(
        facts=ask("facts") | own | PARSE
    )
    assert early(chain) == [("RunnableAssign<facts>[seq:step:2]", False)]


# -- the same results and the same finished traces ------------------------------------
@pytest.mark.parametrize("build", [three_assigns, retrieval_and_check], ids=["three_assigns", "retrieval_and_check"])
def test_early_steps_give_langchains_results_and_traces(build: Any) -> None:
    inputs = TEXTS if build is three_assigns else QUESTIONS
    assert_equivalent(build, inputs, execution="auto")


class GateChat(EchoChat):
    """Waits (up to 10 s) for `gate` before answering, or opens it: two steps run at once or not at all."""

    gate: Any = None
    opens: bool = False

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        if self.opens:
            self.gate.set()
        elif not self.gate.wait(10):
            raise TimeoutError("the step after me never started while I ran")
        return super()._generate(messages, stop, run_manager, **kwargs)

    async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        if self.opens:
            self.gate.set()
        elif not await asyncio.to_thread(self.gate.wait, 10):
            raise TimeoutError("the step after me never started while I ran")
        return super()._generate(messages, stop, run_manager, **kwargs)


def gated() -> Runnable[Any, Any]:
    gate = threading.Event()
    first = RunnablePassthrough.assign(summary=ask("summarize") | GateChat(gate=gate) | PARSE)
    return first | RunnablePassthrough.assign(facts=ask("facts") | GateChat(gate=gate, opens=True) | PARSE)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_the_early_step_runs_while_the_step_ahead_runs(mode: str) -> None:
    """Step 1's model answers only once step 2's model has started: in order, this would time out."""
    fast = optimize(gated())
    try:
        x = {"text": "cats"}
        got = fast.invoke(x) if mode == "invoke" else asyncio.run(fast.ainvoke(x))
        assert got["facts"] == EchoChat().invoke(ask("facts").invoke(x)).content
    finally:
        fast.close()


class FailOn(EchoChat):
    """Raises when its prompt contains `word`."""

    word: str = "boom"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        if any(self.word in str(m.content) for m in messages):
            raise ValueError(f"{self.word}: the model failed")
        return super()._generate(messages, stop, run_manager, **kwargs)


def failing(where: str) -> Runnable[Any, Any]:
    llm = FailOn()
    first = ask("boom" if where == "ahead" else "summarize")
    second = ask("boom" if where == "early" else "facts")
    if where == "missing":
        second = ChatPromptTemplate.from_template("{absent} {text}")
    one, two = first | llm | PARSE, second | llm | PARSE
    return RunnablePassthrough.assign(summary=one) | RunnablePassthrough.assign(facts=two)


@pytest.mark.parametrize("where", ["ahead", "early", "missing"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "batch", "abatch"])
def test_errors_mid_chain_leave_langchains_trace(where: str, mode: str) -> None:
    """The step ahead fails (the early step's recording is dropped), the early step fails (its error
    is raised when the chain reaches it), or a prompt misses a variable (it runs again, in order, so
    the error names the keys LangChain's prompt got)."""
    plain, fast = failing(where), optimize(failing(where))
    try:
        assert fast.plan.early[0].early
        # One input in every mode: when a batch's input fails, plain LangChain's own trace of
        # the others depends on timing (their runs end with their own error, CancelledError,
        # or not before the batch raises), so two runs of the plain chain can differ.
        inputs = [{"text": "cats"}]
        expected, got = outcome(plain, mode, inputs), outcome(fast, mode, inputs)
        assert got[0] == expected[0] == "raised" and got[1] is expected[1]
        assert got[2] == expected[2]
    finally:
        fast.close()


# -- LangSmith's tracer ---------------------------------------------------------------
class _FakeClient:
    """What LangSmith's tracer sends: every created run, updated in place."""

    def __init__(self) -> None:
        self.runs: dict[Any, dict[str, Any]] = {}

    def create_run(self, **run: Any) -> None:
        self.runs[run["id"]] = dict(run)

    def update_run(self, run_id: Any, **run: Any) -> None:
        self.runs.setdefault(run_id, {}).update({k: v for k, v in run.items() if v is not None})

    def flush(self) -> None:
        pass

    def tree(self) -> list[Any]:
        def node(run_id: Any) -> Any:
            run = self.runs[run_id]
            error = (run.get("error") or "").splitlines()[:1]
            kids = sorted((node(k) for k, r in self.runs.items() if r.get("parent_run_id") == run_id), key=repr)
            inputs = re.sub(r"(run-|lc_run--)[0-9a-f-]{36}(-\d+)?", "<run>", repr(run.get("inputs")))
            outputs = re.sub(r"(run-|lc_run--)[0-9a-f-]{36}(-\d+)?", "<run>", repr(run.get("outputs")))
            return (run["name"], run["run_type"], sorted(run.get("tags") or []), inputs, outputs, error, kids)

        return sorted((node(k) for k, r in self.runs.items() if r.get("parent_run_id") is None), key=repr)


@pytest.mark.parametrize("where", ["fine", "ahead"])
def test_langsmith_receives_the_same_runs(where: str) -> None:
    build = (lambda: retrieval_and_check()) if where == "fine" else (lambda: failing("ahead"))
    x = {"question": "what about cats"} if where == "fine" else {"text": "cats"}
    trees = []
    for runnable in (build(), optimize(build())):
        client = _FakeClient()
        tracer = LangChainTracer(client=client, project_name="teola-test")
        try:
            asyncio.run(runnable.ainvoke(x, {"callbacks": [tracer]}))
        except ValueError:
            assert where == "ahead"
        tracer.wait_for_futures()
        trees.append(client.tree())
    assert trees[0] == trees[1]
    assert len(repr(trees[0])) > 200  # a real tree, not two empty ones
