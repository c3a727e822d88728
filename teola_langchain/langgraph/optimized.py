"""`optimize(graph)`: the same compiled graph, run by LangGraph, with its model calls on Teola.

    fast = teola.optimize(graph)          # a copy of the compiled graph; the original is untouched
    await fast.ainvoke({"question": "..."}, {"configurable": {"thread_id": "t1"}})
    fast.get_state(config)                # same checkpointer, same threads
    print(fast.explain())

Why LangGraph stays the executor: its semantics are the contract (supersteps, channels,
reducers, writes applied when a superstep ends, checkpoints, interrupts, `Send`, retries,
node caching, streams in every mode). Teola changes only *when* the model calls that the
nodes make are sent (`gate.py`, `admission.py`), which cannot change what they return.

How: the optimized graph is an instance of a subclass of the graph's own class, with the
same attributes (`__dict__` copied, so the nodes, channels, checkpointer, store and cache
are the original's). Every way of running a graph goes through `stream` or `astream`
(`invoke`, `batch`, `stream_events`, `astream_events`, ... call them), so those two are
the only methods it overrides: each opens a run (`ProgramRuns.open`), sets the context
variable that puts the run's handler (`gate.py`) on every callback manager configured while
LangGraph executes a step of the run, and closes the run when the stream ends, however
it ends. A run inside a run (the graph called from a node of an optimized run) is part
of the outer run. Everything else (`get_state`, `update_state`, `get_graph`, ...) is
LangGraph's own, on the same objects.

Chains as nodes (`runnable_nodes=True`): the copy gets its own node table in which each
node whose runnable is an LCEL chain runs `teola.optimize(chain)` instead (batching,
prefill split, decode pipelining inside the chain); LangGraph still calls it as a node.
Off by default until the LCEL executor keeps LangChain's callbacks exactly; LangGraph's
suite passes routed either way (`tests/conformance`).

Backends: `backend`, `ray` and `engines` go to those chains' `teola.optimize`, so with
`backend="ray"` each chain's Teola engines run in Ray actors placed as `ray` says, while
LangGraph, the chains' own framework objects and the gate stay in the driver. The
options apply to the graph as a whole: an `engines=` pair or a `ray=` engine key must
match some chain's engines (`EngineChoices.check_used`, `RayOptions.check_keys`).

    fast = teola.optimize(graph, runnable_nodes=True, backend="ray",
                          engines=[(embeddings, MyEmbedder())],
                          ray={"engines": {MyEmbedder: {"resources": {"gpu_node": 1}}}})
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph.pregel import Pregel

from teola_core.dropin import DropIn
from teola_core.engines.choices import EngineOption
from teola_core.explain import section
from teola_core.runtime.backends import DEFAULT_BACKEND, check_backend
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.parts import SharedOptions
from teola_core.runtime.ray.options import RayOptions
from teola_core.runtime.timeline import RecentSpans
from teola_langchain.configure_hooks import holding
from teola_langchain.engines import EngineChoices
from teola_langchain.langgraph.structure import LCEL_CHAINS, is_create_agent, node_kinds
from teola_langchain.program_order.admission import AUTO, Concurrency, ModelAdmission
from teola_langchain.program_order.gate import CURRENT_GATE, gated_chunks
from teola_langchain.program_order.runs import ProgramRuns
from teola_langchain.runnable import TeolaRunnable


class OptimizedGraph(DropIn):
    """Mixed into a copy of the user's compiled graph (see the module docstring).

    It is the graph (a copy of it), so nothing is forwarded; the model calls its nodes make
    are ordered by `ProgramRuns`, and its chain nodes are `TeolaRunnable`s with their own
    runtimes (`runnable_nodes=True`).
    """

    forwards_to = None
    _teola: ProgramRuns
    _teola_original: Pregel
    _teola_chains: dict[str, TeolaRunnable[Any, Any]]  # nodes whose chain runs through teola.optimize

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if CURRENT_GATE.get() is not None:  # part of a run already open here
            yield from super().stream(*args, **kwargs)  # type: ignore[misc]
            return
        runs = self._teola
        gate = runs.open(None)
        chunks = super().stream(*args, **kwargs)  # type: ignore[misc]
        try:
            while True:
                with holding(CURRENT_GATE, gate):
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        return
                yield chunk
        finally:
            try:
                with holding(CURRENT_GATE, gate):
                    chunks.close()
            finally:
                runs.close(gate)

    async def astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if CURRENT_GATE.get() is not None:
            async with contextlib.aclosing(super().astream(*args, **kwargs)) as inner:  # type: ignore[misc]
                async for chunk in inner:  # closed when this stream is (LangGraph then cancels its tasks)
                    yield chunk
            return
        runs = self._teola
        gate = runs.open(asyncio.get_running_loop())
        try:
            async with contextlib.aclosing(gated_chunks(gate, super().astream(*args, **kwargs))) as chunks:  # type: ignore[misc]
                async for chunk in chunks:
                    yield chunk
        finally:
            runs.close(gate)

    def copy(self, update: dict[str, Any] | None = None) -> Any:
        """LangGraph's copy (`with_config` uses it), still optimized, sharing this graph's runs."""
        copied = super().copy(update)  # type: ignore[misc]
        copied._teola = self._teola
        copied._teola_original = self._teola_original
        copied._teola_chains = self._teola_chains
        return copied

    @property
    def calls_on_graph(self) -> int:
        """Runs in which Teola admitted at least one model call."""
        return self._teola.calls_on_graph

    @property
    def original(self) -> Pregel:
        """The compiled graph this one was made from."""
        return self._teola_original

    @property
    def chains(self) -> dict[str, TeolaRunnable[Any, Any]]:
        """Node name -> the optimized chain that node runs (`runnable_nodes=True`)."""
        return dict(self._teola_chains)

    @property
    def recent(self) -> RecentSpans:  # type: ignore[override]
        """The last model calls' spans, on every loop (shared with this graph's copies)."""
        return self._teola.recent

    def runtime(self) -> ModelAdmission:
        """What orders this graph's model calls on the running event loop (made on first use)."""
        return self._teola.admission(asyncio.get_running_loop())

    def add_hook(self, hook: RuntimeHook) -> None:
        """Observe every model call of every run (a prefill and a decode span each), on every loop."""
        self._teola.add_hook(hook)

    def where(self) -> dict[str, str]:
        """Per engine: the model engines seen so far run in the driver (the nodes call them);
        a chain node's engines as its `TeolaRunnable` places them ("node/engine")."""
        out = dict.fromkeys(self._teola.engines(), "driver")
        for node, chain in self._teola_chains.items():
            out |= {f"{node}/{engine}": place for engine, place in chain.where().items()}
        return out

    @property
    def engine_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.where()))

    def close(self) -> None:
        """Stop the loop threads of the sync methods and the chains' Ray actors (all restart if used)."""
        self._teola.shutdown()
        for chain in self._teola_chains.values():
            chain.close()

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """What LangGraph runs and what Teola does for each node (and the graph in Mermaid), the
        engines seen so far, and advice."""
        runs = self._teola
        original = self._teola_original
        out = [
            f"Teola plan for the LangGraph graph {original.get_name()!r} ({type(original).__name__})\n",
            "LangGraph runs the graph (supersteps, state, checkpoints, streams); Teola schedules the model "
            "calls its nodes make (teola_langchain.program_order.gate).\n",
        ]
        lines = [
            f"- {k.name}: {k.kind} ({k.runnable}): {_node_plan(k.kind, self._teola_chains.get(k.name))}"
            for k in node_kinds(original)
        ]
        out.append(section("nodes", "\n".join(lines) or "- none"))
        if runs.concurrency is None:
            bound = "no bound: a call goes as soon as its node makes it"
        elif runs.concurrency == AUTO:
            bound = (
                "learned from each model's server (async runs): calls go at once while it has room, and wait in "
                "Teola, earlier runs first, once requests wait there"
            )
        else:
            bound = f"at most {runs.concurrency} in flight per model; the others wait, earlier runs first"
        servers = "".join(f"\n- server {line}" for line in runs.servers())
        engines = ", ".join(runs.engines()) or "none"
        out.append(section("model calls", f"- {bound}{servers}\n- engines so far: {engines}"))
        out.append(
            section(
                "runs",
                f"- {runs.runs} run(s); {runs.calls_on_graph} with model calls on Teola ({runs.model_calls} calls)",
            )
        )
        advice = _advice(original, self._teola_chains, runs.concurrency)
        out.append(section("advice", "\n".join(f"- {a}" for a in advice) or "- none"))
        out.append(section("mermaid (the graph as LangGraph draws it)", original.get_graph().draw_mermaid()))
        return out


def _node_plan(kind: str, chain: TeolaRunnable[Any, Any] | None) -> str:
    if kind == "chain":
        if chain is None:
            return "run by LangChain as written"
        where = "; ".join(f"{name} ({place})" for name, place in sorted(chain.where().items()))
        return f"traced by teola.optimize (LCEL); backend {chain.backend}, engines: {where or 'none'}"
    if kind == "subgraph":
        return "run by LangGraph; its nodes' model calls belong to the run"
    if kind == "tools":
        return "run by LangGraph; tool calls as written"
    return "run as written; the model calls it makes are scheduled by Teola"


def _advice(graph: Pregel, chains: Mapping[str, Any], concurrency: Concurrency) -> list[str]:
    advice = []
    if is_create_agent(graph):
        advice.append(
            "this is a create_agent agent without TeolaMiddleware: it runs as LangGraph runs it. Build it with "
            "create_agent(model, tools, middleware=[..., TeolaMiddleware()]) (from teola_langchain.agents import "
            "TeolaMiddleware) to run its model and tool calls on Teola's agent runtime (priority by run, KV "
            "retention during tool calls, shared results of idempotent tools, summaries ahead of time)"
        )
    untraced = [k.name for k in node_kinds(graph) if k.kind == "chain" and k.name not in chains]
    if untraced:
        advice.append(
            f"nodes {untraced} are LCEL chains: teola.optimize(graph, runnable_nodes=True) runs them through "
            "teola.optimize (batching, prefill split, decode pipelining inside the chain)"
        )
    if concurrency is None:
        advice.append(
            "model_concurrency=None holds nothing: leave it 'auto' to learn each vLLM server's bound from its "
            "/metrics, or give the number of requests your server runs at once (llama.cpp --parallel, an API's "
            "concurrency limit); calls beyond it then wait in Teola, earlier runs first, instead of in the "
            "server's queue behind later runs' fan-outs"
        )
    return advice


@functools.cache
def optimized_class(cls: type[Pregel]) -> type[Pregel]:
    """`cls` with `OptimizedGraph` mixed in (one class per graph class)."""
    return type(cls.__name__, (OptimizedGraph, cls), {"__module__": __name__, "__qualname__": cls.__qualname__})


def optimize_graph(
    graph: Pregel,
    *,
    model_concurrency: Concurrency = AUTO,
    runnable_nodes: bool = False,
    hooks: Sequence[RuntimeHook] = (),
    backend: str = DEFAULT_BACKEND,
    ray: RayOptions | Mapping[str, Any] | None = None,
    engines: EngineOption = None,
) -> Pregel:
    """A copy of `graph` whose model calls run on Teola (see the module docstring).

    model_concurrency: model calls in flight at once per model: "auto" (learned from each
        vLLM-like server's `/metrics`), an int, or None (no bound); beyond it calls wait in
        Teola, earlier runs first (`admission.py`).
    runnable_nodes: run nodes that are LCEL chains (`RunnableSequence`, `RunnableParallel`,
        `RunnableBranch`) through `teola.optimize(chain)`; off, they run as LangChain runs them.
    hooks: runtime hooks (`teola_core.runtime.timeline.SpanRecorder`, ...): they see one
        prefill and one decode span per model call (queued, admitted, ended).
    backend, ray, engines: the chains' `teola.optimize` options (`TeolaRunnable`), for the
        graph as a whole (see the module docstring); they need `runnable_nodes=True`.
    """
    check_backend(backend, ray)
    chain_options = {"backend": backend != DEFAULT_BACKEND, "ray": ray is not None, "engines": engines is not None}
    given = [name for name, set_ in chain_options.items() if set_]
    if given and not runnable_nodes:
        raise ValueError(
            f"optimize(graph, {', '.join(f'{name}=...' for name in given)}) applies to the graph's LCEL chain nodes, "
            "which run through teola.optimize only with runnable_nodes=True (function nodes make their own model "
            "calls, in the driver): add runnable_nodes=True"
        )
    original = graph._teola_original if isinstance(graph, OptimizedGraph) else graph
    cls = optimized_class(type(original))
    fast = cls.__new__(cls)
    fast.__dict__.update(original.__dict__)
    fast._teola = ProgramRuns(original.get_name(), model_concurrency, hooks)
    fast._teola_original = original
    fast._teola_chains = {}
    if runnable_nodes:
        chains = optimize_chains(original, backend, ray, engines)
        fast.nodes = {n: node.copy({"bound": chains[n]}) if n in chains else node for n, node in original.nodes.items()}
        fast._teola_chains = chains
    return fast


def optimize_chains(
    graph: Pregel, backend: str, ray: RayOptions | Mapping[str, Any] | None, engines: EngineOption
) -> dict[str, TeolaRunnable[Any, Any]]:
    """`teola.optimize` of every LCEL chain node, with the graph's options checked across them all."""
    shared = SharedOptions(EngineChoices(engines), backend, ray)
    options = {"backend": backend, **shared.part_options()}
    chains: dict[str, TeolaRunnable[Any, Any]] = {}
    try:
        for name, node in graph.nodes.items():
            if isinstance(node.bound, LCEL_CHAINS) and not node.subgraphs:
                chains[name] = TeolaRunnable(node.bound, **options)
        shared.check([chain.engine_set for chain in chains.values()])
    except BaseException:
        for chain in chains.values():
            chain.close()
        raise
    return chains
