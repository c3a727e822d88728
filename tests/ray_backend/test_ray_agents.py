"""An agent runtime on the Ray backend: a program's model calls run on a Ray actor and
answer what they answer on the local runtime."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from toy_engines import ToyLLM  # noqa: E402

from teola_core.agents import AgentRuntime  # noqa: E402
from teola_core.engines.protocol import EngineSet  # noqa: E402
from teola_core.runtime.backends import make_runtime  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


async def _two_turns(agents: AgentRuntime) -> list[str]:
    program = agents.program("agent")
    try:
        first = await program.generate("task: add 2 and 3", engine="llm", max_tokens=8)
        observation = await program.call_tool("calc", {"a": 2, "b": 3}, _five)
        second = await program.generate("task: add 2 and 3" + first + observation, engine="llm", max_tokens=8)
        return [first, observation, second]
    finally:
        program.finish()
        await agents.close()


async def _five() -> str:
    return " 5"


def test_an_agent_runtime_runs_its_programs_on_ray() -> None:
    expected = asyncio.run(_two_turns(AgentRuntime(EngineSet().add(ToyLLM("llm")))))
    engines = EngineSet().add(ToyLLM("llm"))
    runtime = make_runtime(engines, "ray")
    assert asyncio.run(_two_turns(AgentRuntime(engines, runtime=runtime))) == expected
    assert set(runtime.placed.where()) == {"llm"} and "driver" not in runtime.placed.where()["llm"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_optimized_create_agent_agent_answers_on_ray_as_locally() -> None:
    """`teola.optimize(agent, backend="ray")`: its runs' graphs on a Ray runtime (the drop-in
    kit's one factory); the agent's model stays in the driver, where the middleware calls it."""
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent
    from langchain_adapter.lc_fakes import EchoChat

    import teola
    from teola_core.runtime.ray import RayRuntime
    from teola_langchain.agents import TeolaMiddleware

    agent = create_agent(EchoChat(), [], middleware=[TeolaMiddleware()])

    async def contents(app: Any) -> list[list[str]]:
        runs = [app.ainvoke({"messages": [("user", f"question {i}")]}) for i in range(4)]
        return [[str(m.content) for m in out["messages"]] for out in await asyncio.gather(*runs)]

    local = teola.optimize(agent)
    fast = teola.optimize(agent, backend="ray")

    async def on_ray() -> tuple[list[list[str]], Any]:
        return await contents(fast), fast.runtime().runtime

    try:
        expected = asyncio.run(contents(local))
        got, runtime = asyncio.run(on_ray())
        assert got == expected and isinstance(runtime, RayRuntime)
        assert fast.where() == {fast.engine_name: "driver"}
    finally:
        fast.close()
        local.close()
