"""The drop-in runnable: event loops, concurrency limits, callbacks, config, backends."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from lc_fakes import EchoChat, assert_equivalent
from test_lc_equivalence import CASES

from teola_adapters.simulated import run_virtual
from teola_langchain import OpaqueStepWarning, TeolaRunnable, optimize


def chain() -> Runnable[Any, Any]:
    return PromptTemplate.from_template("About {topic}") | EchoChat() | StrOutputParser()


def test_is_a_langchain_runnable_with_the_same_types_and_graph() -> None:
    original = chain()
    fast = optimize(original)
    assert isinstance(fast, Runnable) and isinstance(fast, TeolaRunnable)
    assert fast.get_name() == original.get_name()
    assert fast.get_input_jsonschema() == original.get_input_jsonschema()
    assert fast.OutputType == original.OutputType
    assert fast.get_graph().to_json() == original.get_graph().to_json()
    composed = fast | RunnableLambda(str.upper)
    assert composed.invoke({"topic": "cats"}) == (original | RunnableLambda(str.upper)).invoke({"topic": "cats"})
    fast.close()


def test_sync_invoke_inside_a_running_event_loop() -> None:
    fast = optimize(chain())

    async def main() -> str:
        return fast.invoke({"topic": "cats"})  # a sync call from async code, as users do

    assert asyncio.run(main()) == chain().invoke({"topic": "cats"})
    fast.close()


def test_async_steps_run_on_the_callers_loop() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def where(x: int) -> int:
        loops.append(asyncio.get_running_loop())
        return x

    fast = optimize(RunnableLambda(where) | RunnableLambda(where))

    async def main() -> asyncio.AbstractEventLoop:
        await fast.ainvoke(1)
        return asyncio.get_running_loop()

    loop = asyncio.run(main())
    assert loops == [loop, loop]
    fast.close()


def test_a_sync_call_on_a_thread_running_a_loop_runs_as_langchain_runs_it() -> None:
    fast = optimize(chain())

    async def reenter() -> Any:
        return fast.invoke({"topic": "cats"}), fast.batch([{"topic": "dogs"}])  # no hand-off that blocks this loop

    assert fast.sync_thread.run(reenter()) == (chain().invoke({"topic": "cats"}), chain().batch([{"topic": "dogs"}]))
    assert fast.calls_on_graph == 0
    fast.close()


class Wave:
    """A sync step (it runs in a worker thread): counts the calls in flight, and holds each of
    the first `size` calls until `size` of them are in flight at once, so the test sees that
    many overlap instead of hoping a sleep makes them; the later calls pass at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.together = threading.Barrier(size)
        self.lock = threading.Lock()
        self.calls = self.now = self.peak = 0

    def __call__(self, x: int) -> int:
        with self.lock:
            self.calls += 1
            first_wave = self.calls <= self.size
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            if first_wave:
                self.together.wait(timeout=60)  # only a hang guard: a run that passes never waits it out
        finally:
            with self.lock:
                self.now -= 1
        return x


@pytest.mark.parametrize("execution", ["auto", "graph"])  # lambdas only: "auto" runs as LangChain runs them
def test_max_concurrency_is_honoured_in_batch(execution: str) -> None:
    """Sync steps in worker threads: the bound is reached (the first calls wait for each other),
    and no excess was seen; that none can happen is exact in the abatch test below."""
    for limit, wave in ((2, 2), (None, 4)):
        step = Wave(wave)
        fast = optimize(RunnableLambda(step) | RunnableLambda(lambda x: x + 1), execution=execution)
        config: RunnableConfig = {"max_concurrency": limit} if limit else {}
        assert fast.batch(list(range(8)), config) == list(range(1, 9))
        assert fast.calls_on_graph == (1 if execution == "graph" else 0)
        if limit:
            assert step.peak == limit
        else:
            assert step.peak >= 4  # unlimited: every input is its own concurrent query
        fast.close()


@pytest.mark.parametrize("execution", ["auto", "graph"])
def test_max_concurrency_is_honoured_in_abatch_exactly(execution: str) -> None:
    """Async steps on the virtual-time loop: every query that may start does so before the
    clock moves, so the peak is exact (a bound not kept is always seen), and so is the
    number of 1-second waves."""
    state = {"now": 0, "peak": 0}

    async def slow(x: int) -> int:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(1.0)  # virtual: the model of a step taking a second
        state["now"] -= 1
        return x

    async def plus_one(x: int) -> int:
        return x + 1

    fast = optimize(RunnableLambda(slow) | RunnableLambda(plus_one), execution=execution)

    async def run(config: RunnableConfig) -> tuple[list[int], float]:
        loop = asyncio.get_running_loop()
        results = await fast.abatch(list(range(8)), config)
        return results, loop.time()

    for limit, peak, waves in ((3, 3, 3), (2, 2, 4), (None, 8, 1)):
        state["peak"] = 0
        config: RunnableConfig = {"max_concurrency": limit} if limit else {}
        assert run_virtual(run(config)) == (list(range(1, 9)), float(waves))
        assert state["peak"] == peak
    assert fast.calls_on_graph == (3 if execution == "graph" else 0)
    fast.close()


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, list[str], dict[str, Any], UUID | None, UUID]] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kw: Any) -> None:
        self.events.append(
            (
                "chain",
                kw.get("name", ""),
                kw.get("tags", []),
                kw.get("metadata", {}),
                kw.get("parent_run_id"),
                kw["run_id"],
            )
        )

    def on_chat_model_start(self, serialized: Any, messages: Any, **kw: Any) -> None:
        self.events.append(
            ("chat", "", kw.get("tags", []), kw.get("metadata", {}), kw.get("parent_run_id"), kw["run_id"])
        )


@pytest.mark.parametrize("method", ["invoke", "ainvoke", "batch", "abatch", "stream"])
def test_callbacks_tags_and_metadata_reach_the_run_and_the_model(method: str) -> None:
    recorder = Recorder()
    config: RunnableConfig = {"callbacks": [recorder], "tags": ["mine"], "metadata": {"user": "u1"}, "run_name": "rag"}
    fast = optimize(chain())
    x = {"topic": "cats"}
    if method == "invoke":
        fast.invoke(x, config)
    elif method == "ainvoke":
        asyncio.run(fast.ainvoke(x, config))
    elif method == "batch":
        fast.batch([x], config)
    elif method == "abatch":
        asyncio.run(fast.abatch([x], config))
    else:
        list(fast.stream(x, config))
    top = [e for e in recorder.events if e[0] == "chain" and e[4] is None]
    assert len(top) == 1 and top[0][1] == "rag" and "mine" in top[0][2] and top[0][3]["user"] == "u1"
    chats = [e for e in recorder.events if e[0] == "chat"]
    assert len(chats) == 1
    assert "mine" in chats[0][2] and chats[0][3]["user"] == "u1"
    assert chats[0][4] is not None  # a child of the optimized chain's run
    fast.close()


def test_two_optimized_runnables_share_nothing() -> None:
    a, b = optimize(chain()), optimize(chain())
    assert a.sync_thread is not b.sync_thread and a._engines is not b._engines
    assert a.invoke({"topic": "x"}) == b.invoke({"topic": "x"})
    a.close()
    assert b.invoke({"topic": "y"}) == chain().invoke({"topic": "y"})  # b is unaffected
    assert a.invoke({"topic": "y"}) == chain().invoke({"topic": "y"})  # a restarts its loop
    a.close()
    b.close()


def test_kwargs_fall_back_to_the_original_chain() -> None:
    seen: list[Any] = []

    def f(x: int, **kwargs: Any) -> int:
        seen.append(kwargs)
        return x

    fast = optimize(RunnableLambda(f))
    assert fast.invoke(1, None, extra=2) == 1
    fast.close()


LOCAL_CASES = [
    "naive_rag",
    "multi_query_numbered_list",
    "rag_with_rerank_lambda",
    "branch",
    "map_prompt_model_chain",
    "fallbacks",
    "async_lambdas",
    "itemgetter_and_pick",
]


@pytest.mark.parametrize("name", LOCAL_CASES)
def test_equivalent_on_the_local_runtime(name: str) -> None:
    pytest.importorskip("teola_core.runtime.local")
    build, inputs, options = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueStepWarning)
        assert_equivalent(build, inputs, backend="local", **options)
