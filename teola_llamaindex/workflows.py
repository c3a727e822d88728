"""Run a LlamaIndex `Workflow` (llama-index-core 0.14) with its model calls on Teola.

    fast = teola.optimize(workflow)
    await fast.run(topic="...") == await workflow.run(topic="...")

A workflow builds its graph while it runs, so it is not traced ahead of time: a shallow
copy of it holds proxies of its LLM, embedding and retriever attributes
(`workflow_calls`), and each call a step makes through them is a small graph on a
runtime shared by all runs (`workflow_router`), at the depth of the step in the workflow's step/event graph
(`step_depths`). Why, and what the proxies call: docs/llamaindex.md ("Workflows").
"""

from __future__ import annotations

import copy
import itertools
import time
from pathlib import Path
from typing import Any

from llama_index.core.workflow import Workflow

from teola_core.dropin import DropIn
from teola_core.engines.protocol import EngineSet
from teola_core.explain import file_name, mermaid, section
from teola_core.ir.draw import draw_graph
from teola_core.runtime.backends import DEFAULT_BACKEND
from teola_llamaindex.workflow_calls import proxy_for
from teola_llamaindex.workflow_router import CallRouter, node_depth

# -- the static step/event graph -------------------------------------------------------


def step_depths(workflow: Workflow) -> dict[str, int]:
    """Each step's longest path, in steps, to one that returns a `StopEvent` (cycles cut)."""
    configs = {name: fn._step_config for name, fn in workflow._get_steps().items()}

    def produces(name: str) -> list[type]:
        return [t for t in configs[name].return_types if isinstance(t, type)]

    successors = {
        name: [
            other
            for other, cfg in configs.items()
            if any(isinstance(e, type) and issubclass(r, e) for r in produces(name) for e in cfg.accepted_events)
        ]
        for name in configs
    }
    depths: dict[str, int] = {}

    def visit(name: str, path: frozenset[str]) -> int:
        if name in depths:
            return depths[name]
        inner = path | {name}
        below = max((visit(s, inner) for s in successors[name] if s not in inner), default=0)
        depth = 1 + below
        if not (inner & set(successors[name])):  # not inside a cycle still being explored
            depths[name] = depth
        return depth

    return {name: visit(name, frozenset()) for name in configs}


# -- the drop-in -----------------------------------------------------------------------


class TeolaWorkflow(DropIn):
    """`run(...)` of a `Workflow` with its model calls on Teola (see the module docstring).

    policy: the engine schedulers' batching policy ("topology", "fifo", "po", "to").
    backend, ray: the runtime of the calls' graphs ("local" or "ray", as for every drop-in;
    the workflow's models and retrievers stay in the driver on both, where its steps call
    them). The original workflow is left untouched; `workflow` is the copy that runs (its
    other attributes are this object's).
    """

    forwards_to = "workflow"

    def __init__(
        self, workflow: Workflow, *, policy: str = "topology", backend: str = DEFAULT_BACKEND, ray: Any = None
    ) -> None:
        self.original = workflow
        self._router = CallRouter(step_depths(workflow))
        self.workflow = copy.copy(workflow)
        self.proxied: dict[str, str] = {}
        for name, value in vars(workflow).items():
            proxy = proxy_for(value, self._router)
            if proxy is not None:
                setattr(self.workflow, name, proxy)
                self.proxied[name] = type(value).__name__
        self._runs = itertools.count()
        self.place_engines(self._router.engines, backend=backend, policy=policy, ray=ray, depth_cost=node_depth)
        self._router.runtimes = self.runtimes

    @property
    def engines(self) -> EngineSet:
        return self._router.engines

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """`Workflow.run`: the same handler; its steps' proxied calls carry this run's key and start."""
        token = self._router.run_key.set(f"run{next(self._runs)}")
        started = self._router.run_started.set(time.monotonic())  # the runtimes' clock
        try:
            return self.workflow.run(*args, **kwargs)
        finally:
            self._router.run_started.reset(started)
            self._router.run_key.reset(token)

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """The components whose calls run on Teola, each step's depth (the calls' priority), the
        engines and where they run, and the call graphs (Mermaid; PNGs with `png_dir`)."""
        proxied = "\n".join(f"- {name}: {kind}" for name, kind in self.proxied.items()) or "- none"
        depths = "\n".join(f"- {step}: {depth}" for step, depth in sorted(self._router.depths.items())) or "- none"
        engines = self.engines.engines.items()
        where = self.where()
        out = [
            f"Teola plan for the workflow {type(self.original).__name__}\n",
            section("components whose calls run on Teola's engines", proxied),
            section("step depths (a call's priority: deeper steps are nearer the end)", depths),
            section("engines", "\n".join(f"- {n}: {type(e).__name__} ({where[n]})" for n, e in engines) or "- none"),
        ]
        for (kind, engine, depth, search), graph in self._router.graphs().items():
            name = f"{kind} on {engine}" + (f" and {search}" if search else "") + f" at depth {depth}"
            out += [section(f"call graph: {name}", graph.summary()), section(f"mermaid {name}", mermaid(graph))]
            if png_dir is not None:
                path = draw_graph(graph, Path(png_dir) / f"{file_name(name)}.png")
                out.append(section(f"picture {name}", str(path)))
        return out
