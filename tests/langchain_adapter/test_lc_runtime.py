"""The drop-in runnable: event loops, concurrency limits, callbacks, config, backends."""

from __future__ import annotations

import asyncio
import threading
import time
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


def test_max_concurrency_is_honoured_in_batch() -> None:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def slow(x: int) -> int:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.02)
        with lock:
            state["now"] -= 1
        return x

    fast = optimize(RunnableLambda(slow) | RunnableLambda(lambda x: x + 1))
    assert fast.batch(list(range(8)), {"max_concurrency": 2}) == list(range(1, 9))
    assert state["peak"] == 2
    state["peak"] = 0
    assert asyncio.run(fast.abatch(list(range(8)), {"max_concurrency": 3})) == list(range(1, 9))
    assert state["peak"] == 3
    state["peak"] = 0
    fast.batch(list(range(8)))
    assert state["peak"] > 3  # unlimited: every input is its own concurrent query
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
