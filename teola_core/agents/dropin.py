"""What every agent drop-in shares, whatever its framework: the agent's engines, one
`AgentRuntime` per event loop over them (its runtime and tool cache hold loop-bound
futures), the recent primitives of them all, the record of the runs that ended, and
`explain()` from those (`teola_core.agents.explain`).

    class MyAgent(AgentDropIn):
        def __init__(self, agent, features=None, priority_rule="fcfs"):
            super().__init__(agent.name, features, priority_rule)
            self.engines.add(MyModelEngine("llm:" + agent.name))   # the engines start empty
        ...  # a run: program = self.runtime_for_current_loop().program(); at its end self.record.add(program)

`teola_langchain.agents.OptimizedAgent` and `teola_llamaindex.agents.TeolaAgent` are built
on it; each keeps only what is its framework's own (hooking the agent, the call surface).
The chain and pipeline drop-ins share `teola_core.runtime.dropin.DropInBase` instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from teola_core.agents.explain import AgentRecord, agent_sections
from teola_core.agents.host import AgentFeatures
from teola_core.agents.runtime import AgentRuntime
from teola_core.engines.protocol import EngineSet
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.per_loop import PerLoop
from teola_core.runtime.timeline import RecentSpans


class AgentDropIn:
    """The engines, runtimes, record and `explain()` of an agent drop-in (see the module docstring).

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
        self._runtimes: PerLoop[AgentRuntime] = PerLoop()
        self.record = AgentRecord()
        self.recent = RecentSpans()
        self.add_hook(self.recent)

    def runtime_for_current_loop(self) -> AgentRuntime:
        """The agent runtime serving runs on the running event loop (made on first use)."""
        return self._runtimes.current(self._new_runtime)

    def _new_runtime(self) -> AgentRuntime:
        return AgentRuntime(self.engines, features=self.features, priority_rule=self.priority_rule)

    def agent_runtimes(self) -> list[AgentRuntime]:
        """The agent runtimes of the loops this agent has run on."""
        return self._runtimes.values()

    def add_hook(self, hook: RuntimeHook) -> None:
        """Observe every primitive (model call) of every run, on every loop's runtime."""
        # The setup holds `hook`, not self: the PerLoop keeps it, and self holds the PerLoop.
        self._runtimes.apply_to_all(lambda runtime: runtime.runtime.add_hook(hook))

    async def _close_current_runtime(self) -> None:
        """Close the running loop's agent runtime, if it has one (the next run makes a fresh one)."""
        runtime = self._runtimes.pop_current()
        if runtime is not None:
            await runtime.close()

    def explain(self, png_dir: str | Path | None = None) -> str:
        """What the agent runtime does, the runs so far, the last run's graph (Mermaid; PNG
        with `png_dir`) and what recent runs did per engine (timeline PNG with `png_dir`)."""
        sections = agent_sections(
            self.agent_name, self.features, self.priority_rule, self.engines, self.record, self.recent.spans(), png_dir
        )
        return "\n".join(sections)
