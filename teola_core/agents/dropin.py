"""What every agent drop-in adds to the drop-in kit (`teola_core.dropin.DropIn`): one
`AgentRuntime` per event loop over the kit's runtime there (its runtime and tool cache
hold loop-bound futures), the record of the runs that ended, and `explain()` from those
(`teola_core.agents.explain`).

    class MyAgent(AgentDropIn):
        def __init__(self, agent, features=None, priority_rule="fcfs", backend="local", ray=None):
            super().__init__(agent.name, features, priority_rule)
            self.engines.add(MyModelEngine("llm:" + agent.name))   # the engines start empty
            self.place_engines(self.engines, backend=backend, ray=ray)
        ...  # a run: program = self.runtime().program(); at its end self.record.add(program)

`teola_langchain.agents.OptimizedAgent` and `teola_llamaindex.agents.TeolaAgent` are built
on it; each keeps only what is its framework's own (hooking the agent, the call surface).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from teola_core.agents.explain import AgentRecord, agent_sections
from teola_core.agents.host import AgentFeatures
from teola_core.agents.runtime import AgentRuntime
from teola_core.dropin import DropIn
from teola_core.engines.protocol import EngineSet
from teola_core.runtime.per_loop import PerLoop


class AgentDropIn(DropIn):
    """The agent runtimes, record and `explain()` of an agent drop-in (see the module docstring).

    agent_name: the agent's name in `explain()`. features and priority_rule: as
    `AgentRuntime` takes them, checked here since the runtimes are made on first use.
    """

    def __init__(self, agent_name: str, features: AgentFeatures | None, priority_rule: Literal["fcfs", "plas"]) -> None:
        if priority_rule not in ("fcfs", "plas"):
            raise ValueError(f"unknown priority rule {priority_rule!r} (known: fcfs, plas)")
        self.agent_name = agent_name
        self.features = features or AgentFeatures()
        self.priority_rule: Literal["fcfs", "plas"] = priority_rule
        self.engines = EngineSet()
        self._agent_runtimes: PerLoop[AgentRuntime] = PerLoop()
        self.record = AgentRecord()

    def runtime(self) -> AgentRuntime:
        """The agent runtime serving runs on the running event loop (made on first use)."""
        return self._agent_runtimes.current(self._new_runtime)

    def _new_runtime(self) -> AgentRuntime:
        runtimes = self.runtimes
        engines = runtimes.placed.engines if runtimes.placed is not None else self.engines
        return AgentRuntime(
            engines, features=self.features, priority_rule=self.priority_rule, runtime=runtimes.current()
        )

    def agent_runtimes(self) -> list[AgentRuntime]:
        """The agent runtimes of the loops this agent has run on."""
        return self._agent_runtimes.values()

    async def _close_current_runtime(self) -> None:
        """Close the running loop's agent runtime, if it has one: its programs end, then its
        runtime (the next run makes fresh ones)."""
        agent_runtime = self._agent_runtimes.pop_current()
        runtime = self.runtimes.pop_current() if self._runtimes is not None else None
        if agent_runtime is not None:
            await agent_runtime.close()
        elif runtime is not None:
            await runtime.close()

    async def aclose(self) -> None:
        await self._close_current_runtime()
        await super().aclose()

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """What the agent runtime does, the runs so far, the last run's graph (Mermaid; PNG with `png_dir`)."""
        return agent_sections(self.agent_name, self.features, self.priority_rule, self.engines, self.record, png_dir)
