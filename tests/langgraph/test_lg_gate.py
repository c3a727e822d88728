"""The gate: model calls of a run wait for Teola's admission, earlier runs first; nothing else changes.

Driven by events (a model that answers when the test releases a prompt, a user handler
that sees each call issued, the gate's engine scheduler announcing the calls queued): no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from engine_watch import queued
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.types import Send
from lg_fakes import EchoChat, GatedChat, answer

import teola
from teola_langchain.program_order.gate import CURRENT_GATE, RunCalls, model_engine


class State(TypedDict):
    first: str
    items: list[str]
    answers: Annotated[list[str], operator.add]


def two_steps(llm: Any) -> Any:
    """`first` is asked alone, then every item at once (a `Send` fan-out)."""

    async def ask_first(state: State) -> dict[str, Any]:
        return {"answers": [(await llm.ainvoke(state["first"])).content]}

    async def ask_item(state: dict[str, str]) -> dict[str, Any]:
        return {"answers": [(await llm.ainvoke(state["item"])).content]}

    b = StateGraph(State)
    b.add_node("ask_first", ask_first)
    b.add_node("ask_item", ask_item)
    b.add_edge(START, "ask_first")
    b.add_conditional_edges("ask_first", lambda s: [Send("ask_item", {"item": i}) for i in s["items"]], ["ask_item"])
    return b.compile()


class Issued(BaseCallbackHandler):
    """A user's handler: an event per prompt once its model call is issued. Inline handlers run in
    order, before the gate's, so it sees the call before Teola holds it."""

    run_inline = True

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.events.setdefault(str(messages[0][-1].content), asyncio.Event()).set()

    async def issued(self, *prompts: str) -> None:
        """Returns once the model calls with these prompts are issued."""
        for prompt in prompts:
            await self.events.setdefault(prompt, asyncio.Event()).wait()


def waiting_in_teola(fast: Any, calls: int) -> asyncio.Event:
    """Set once `calls` model calls wait in Teola's queue of the graph's (only) model: its
    engine scheduler, on the gate's runtime of this loop, holds them."""
    admission = fast._teola.admission(asyncio.get_running_loop())
    (engine,) = admission.engines()
    return queued(admission.runtime(engine), engine, calls)


def fan_out(llm: Any, holds: dict[str, asyncio.Event]) -> Any:
    """Every item asked at once (`Send`); an item in `holds` first waits for its event (a slow tool, say)."""

    async def ask_item(state: dict[str, str]) -> dict[str, Any]:
        if state["item"] in holds:
            await holds[state["item"]].wait()
        return {"answers": [(await llm.ainvoke(state["item"])).content]}

    b = StateGraph(State)
    b.add_node("ask_item", ask_item)
    b.add_conditional_edges(START, lambda s: [Send("ask_item", {"item": i}) for i in s["items"]], ["ask_item"])
    return b.compile()


def test_an_earlier_run_goes_first_even_behind_a_later_runs_fan_out() -> None:
    """One call in flight: run A's call, issued after run B's fan-out queued, is admitted first."""

    async def scenario() -> list[str]:
        llm, issued = GatedChat(), Issued()
        holds = {"a1": asyncio.Event()}
        fast = teola.optimize(fan_out(llm, holds), model_concurrency=1)
        config: RunnableConfig = {"callbacks": [issued]}
        run_a = asyncio.create_task(fast.ainvoke({"first": "", "items": ["a1"], "answers": []}, config))  # rank 0
        run_b = asyncio.create_task(fast.ainvoke({"first": "", "items": ["b1", "b2", "b3"], "answers": []}, config))
        await llm.began("b1")  # B's first call holds the only slot
        await issued.issued("b2", "b3")
        await waiting_in_teola(fast, 2).wait()  # B's other calls wait
        holds["a1"].set()
        await issued.issued("a1")
        await waiting_in_teola(fast, 3).wait()  # A's call waits behind them
        llm.open()  # b1 answers; each call admitted from now on answers at once
        await asyncio.gather(run_a, run_b)
        return llm.started

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == ["b1", "a1", "b2", "b3"]


def test_without_a_bound_calls_go_at_once_in_the_order_issued() -> None:
    async def scenario() -> list[str]:
        llm = GatedChat()
        fast = teola.optimize(two_steps(llm))
        run = asyncio.create_task(fast.ainvoke({"first": "x", "items": ["p", "q", "r"], "answers": []}))
        await llm.began("x")
        llm.release("x")
        for prompt in ("p", "q", "r"):  # all three begin before any is released
            await llm.began(prompt)
        for prompt in ("p", "q", "r"):
            llm.release(prompt)
        await run
        return sorted(llm.started)

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == ["p", "q", "r", "x"]


def test_a_failed_call_frees_its_slot_and_fails_its_run_as_the_graph_does() -> None:
    llm = EchoChat(fail_on="boom")
    graph = two_steps(llm)
    fast = teola.optimize(graph, model_concurrency=1)

    async def runs(g: Any) -> list[Any]:
        return await asyncio.gather(
            g.ainvoke({"first": "ok", "items": ["boom x", "y"], "answers": []}),
            g.ainvoke({"first": "fine", "items": ["z"], "answers": []}),
            return_exceptions=True,
        )

    want, got = asyncio.run(runs(graph)), asyncio.run(runs(fast))
    assert type(got[0]) is type(want[0]) is ValueError and str(got[0]) == str(want[0])
    assert got[1] == want[1]


def beside_a_quick_step(llm: Any) -> Any:
    """A quick step (its update streams first) beside one that asks the model two things at once."""

    def quick(state: State) -> dict[str, Any]:
        return {"answers": ["quick"]}

    async def ask_two(state: State) -> dict[str, Any]:
        replies = await asyncio.gather(*(llm.ainvoke(item) for item in state["items"]))
        return {"answers": [r.content for r in replies]}

    b = StateGraph(State)
    b.add_node("quick", quick)
    b.add_node("ask_two", ask_two)
    b.add_edge(START, "quick")
    b.add_edge(START, "ask_two")
    return b.compile()


@pytest.mark.parametrize("how", ["cancel the task", "close the stream"])
def test_a_run_given_up_cancels_its_model_call_and_withdraws_its_held_ones(how: str) -> None:
    """As plain LangGraph: the run's node tasks are cancelled, so its model call in flight
    ends (cancelled) and its call held in Teola never starts; the slot is free for the next run."""

    async def scenario() -> list[str]:
        llm = GatedChat()
        fast = teola.optimize(beside_a_quick_step(llm), model_concurrency=1)
        given_up = {"first": "", "items": ["a", "b"], "answers": []}
        if how == "cancel the task":
            run = asyncio.create_task(fast.ainvoke(given_up))
            await llm.began("a")
            await waiting_in_teola(fast, 1).wait()  # b waits for a's slot
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        else:
            async with contextlib.aclosing(fast.astream(given_up)) as stream:
                async for chunk in stream:
                    assert chunk == {"quick": {"answers": ["quick"]}}
                    await llm.began("a")
                    await waiting_in_teola(fast, 1).wait()
                    break  # the client leaves while a runs and b waits
        nxt = asyncio.create_task(fast.ainvoke({"first": "", "items": ["c"], "answers": []}))
        await llm.began("c")  # the slot a held is free again
        llm.open()
        assert sorted((await nxt)["answers"]) == sorted(["quick", answer([HumanMessage("c")])])
        return llm.started

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == ["a", "c"]


def test_calls_outside_a_run_and_node_configs_do_not_see_the_gate() -> None:
    seen: list[list[Any]] = []
    llm = EchoChat()

    async def node(state: State, config: RunnableConfig) -> dict[str, Any]:
        manager = config["callbacks"]
        seen.append([*manager.handlers, *manager.inheritable_handlers])
        return {"answers": [(await llm.ainvoke(state["first"], config)).content]}

    b = StateGraph(State)
    b.add_node("node", node)
    b.add_edge(START, "node")
    fast = teola.optimize(b.compile())
    asyncio.run(fast.ainvoke({"first": "q", "items": [], "answers": []}))
    assert fast.calls_on_graph == 1 and fast._teola.model_calls == 1
    assert not any(isinstance(h, RunCalls) for h in seen[0])
    assert CURRENT_GATE.get() is None
    asyncio.run(llm.ainvoke("outside any run"))  # no gate: nothing is counted
    assert fast._teola.model_calls == 1


def test_a_sync_run_waits_for_admission_made_on_teolas_loop() -> None:
    """Sync nodes in LangGraph's worker threads, one call in flight: answers as plain."""
    llm = EchoChat()

    def ask(state: dict[str, str]) -> dict[str, Any]:
        return {"answers": [llm.invoke(state["item"]).content]}

    b = StateGraph(State)
    b.add_node("ask", ask)
    b.add_conditional_edges(START, lambda s: [Send("ask", {"item": i}) for i in s["items"]], ["ask"])
    graph = b.compile()
    fast = teola.optimize(graph, model_concurrency=1)
    state = {"first": "", "items": [f"w{i} v" for i in range(6)], "answers": []}
    assert fast.invoke(state) == graph.invoke(state)
    assert fast._teola.model_calls == 6
    fast.close()


def test_models_are_engines_by_their_tracing_identity() -> None:
    assert model_engine({"id": ["x", "Chat"]}, {"ls_provider": "openai", "ls_model_name": "gpt"}) == "llm:openai/gpt"
    assert model_engine({"id": ["pkg", "mod", "Chat"]}, {"ls_provider": "echo"}) == "llm:pkg.mod.Chat"
    assert model_engine(None, None) == "llm:model"


class _Starts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.names.append(str(messages[0][-1].content))


def test_user_callbacks_see_every_call_once() -> None:
    llm, starts = EchoChat(), _Starts()
    fast = teola.optimize(two_steps(llm), model_concurrency=2)
    asyncio.run(fast.ainvoke({"first": "f", "items": ["i", "j"], "answers": []}, {"callbacks": [starts]}))
    assert sorted(starts.names) == ["f", "i", "j"]
