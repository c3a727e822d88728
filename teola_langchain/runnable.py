"""`optimize(chain)`: a drop-in LangChain `Runnable` that runs the chain on Teola.

    from teola import optimize
    fast = optimize(chain)                    # traced once, here; nothing runs yet
    fast.invoke({"question": "..."})          # same result, runs and callbacks as chain.invoke
    await fast.abatch(questions, {"max_concurrency": 8})
    print(fast.explain())                     # the plan: graphs, passes, engines

What runs: the traced graph (`tracing/tracer.py`) on the runtime backend, every step through its
own method with the config LangChain would give it, every composite's callback run
opened and closed as LangChain's code does — so results, errors, callbacks and traces
are the chain's own. A chain with no model, embedding or search in it (nothing Teola's
engines could schedule) simply runs as LangChain runs it (`planning/plans.py`). `stream`,
`astream`, `transform`, `astream_events` and `astream_log` run through LangChain's own
streaming of the chain, so every chunk and event is LangChain's. `batch`/`abatch` run
every input as a concurrent query on one runtime, with LangChain's batch contract
(`execution/batch_calls.py`).

Sync methods run the graph on an event loop the runnable owns in a daemon thread (one
per runnable, started on first use; `close()` stops it), and the steps' sync methods in
worker threads, as LangChain's sync path runs them; async methods run on the caller's
loop. There is no global state.

Plans learn from every call, and the chain moves to a new plan when what it learned
changes one (`planning/replanning.py`). With `profiles="app.json"` what was learned is read at
start and written at each new plan (and `save_profiles()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

from langchain_core.runnables import Runnable, RunnableConfig, RunnableSequence
from langchain_core.runnables.base import Input, Output, coerce_to_runnable
from langchain_core.runnables.config import ensure_config, get_config_list
from langchain_core.runnables.graph import Graph as LCGraph

from teola_core.dropin import DropIn
from teola_core.explain import section
from teola_core.profiles.learning import LatencyBook
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import BACKENDS, DEFAULT_BACKEND
from teola_core.runtime.base import RuntimeHook
from teola_langchain.components.classes import class_of
from teola_langchain.components.patched import runs_own_code
from teola_langchain.configure_hooks import holding
from teola_langchain.engines import EngineChoices, EngineOption, EngineRegistry
from teola_langchain.execution.batch_calls import abatch_results, aopen_roots, batch_results, open_roots, run_queries
from teola_langchain.execution.context import QueryContext, now_on
from teola_langchain.execution.steps import run_graph
from teola_langchain.planning.explain import explain_plan
from teola_langchain.planning.learning import SpanLearner
from teola_langchain.planning.plans import Plan, Planner
from teola_langchain.planning.replanning import LEARN_AFTER, Replanner
from teola_langchain.program_order.gate import CURRENT_GATE, RunCalls, gated_chunks
from teola_langchain.program_order.runs import ProgramRuns
from teola_langchain.same_structure import SameStructure
from teola_langchain.tracing.traced import TracedChain


class TeolaRunnable(DropIn, SameStructure, Runnable[Input, Output]):
    """A LangChain runnable that runs a traced chain on Teola (see the module docstring).

    It answers with the Runnable API alone: LangChain tells runnables apart by their
    attributes, so the chain's own (`steps`, `bound`, ...) are not forwarded; `original` has them.

    Options:
        backend: "local" (the default: scheduled, batching), "ray" (engines as Ray
            actors) or "reference" (one primitive at a time).
        policy: the local runtime's engine scheduling policy ("topology", "fifo", ...).
        passes: True (the default pipeline), False (none) or a `PassManager`.
        profiles: latency profiles by engine name ("llm:ChatOpenAI", "embed:...") or step
            key ("step:...", or a step's own name when no other step has it; see `explain()`),
            so the passes can plan from the first call; or the path of a JSON file of
            learned profiles, read if it exists and written as the plan learns.
        learn: re-plan with latencies learned from the chain's own calls, after this many
            calls (True: 3) and whenever they change materially; False: never.
        warn: warn once for each step Teola cannot look into.
        hooks: runtime hooks (e.g. `teola_core.runtime.timeline.SpanRecorder`) added to
            every runtime this runnable creates: they see each primitive's span.
        engines: which Teola engine runs a model, embeddings object or vector store of
            the chain: `(component, engine)` pairs, or a function
            `(component, default_engine) -> engine | None` (`engines.EngineChoices`).
        expected_items: how many items a model followed by a list parser and a `.map()`
            is expected to write: the plan for decode pipelining (results never depend on it).
        timeout: seconds an engine batch or a step may run before its query fails with a
            `TimeoutError` naming the step (calls then run on the graph, which keeps the
            deadlines; default: 600 s there, and none when the chain runs as LangChain runs it).
        ray: where engines run on the "ray" backend (`teola_core.runtime.ray.options.RayOptions`,
            or a dict: `{"address": ..., "engines": {name or class: {"num_replicas": 2, ...}}}`).
        execution: "auto" (the default: calls run on Teola's graph when the chain has a
            model, embedding or search for its engines to schedule, else as LangChain
            runs them) or "graph" (always on the graph, e.g. to check a chain's trace).
    """

    forwards_to = None

    def __init__(
        self,
        runnable: Runnable[Input, Output] | Any,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        passes: Any = True,
        profiles: Mapping[str, LatencyProfile] | str | Path | None = None,
        learn: bool | int = True,
        warn: bool = True,
        hooks: Sequence[RuntimeHook] = (),
        engines: EngineOption = None,
        execution: str = "auto",
        expected_items: int | None = None,
        ray: Any = None,
        timeout: float | None = None,
    ) -> None:
        if execution not in ("auto", "graph"):
            raise ValueError(f"execution={execution!r}: expected 'auto' or 'graph'")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        original = cast("Runnable[Input, Output]", coerce_to_runnable(runnable))
        self.original = original
        self.name = original.get_name()
        self.backend = backend
        self.policy = policy
        learn_after = 0 if learn is False else LEARN_AFTER if learn is True else int(learn)
        self.profiles_path = Path(profiles) if isinstance(profiles, (str, Path)) else None
        self.learned = LatencyBook()  # what the calls teach (`planning/learning.py`), shared with the replanner
        if self.profiles_path is not None and self.profiles_path.exists():
            self.learned = LatencyBook.load(self.profiles_path)
        choices = EngineChoices(engines)
        self._engines = EngineRegistry(choices)
        given: Mapping[str, LatencyProfile] = profiles if isinstance(profiles, Mapping) else {}
        planner = Planner(original, self._engines, given, passes, execution, timeout, expected_items)
        self._replanner = Replanner(
            planner, self.learned, learn_after=learn_after, profiles_path=self.profiles_path, name=self.name, warn=warn
        )
        choices.check_used()
        self._batches_as_sequence = class_of(original) is RunnableSequence and runs_own_code(original, RunnableSequence)
        learner = (SpanLearner(self.learned),) if self._replanner.learning else ()
        self.place_engines(
            self._engines.engines, backend=backend, policy=policy, ray=ray, timeouts=timeout, hooks=(*hooks, *learner)
        )
        self.start_sync_thread(f"teola:{self.name}")
        self.calls_on_graph = 0  # calls that ran on Teola's graph (the rest ran as LangChain runs them)
        # Calls run as LangChain runs them still get program-level order at a model server
        # that reports its load: each call is a program whose model calls Teola admits.
        served = any(getattr(e, "load_watch", None) is not None for e in self._engines.engines.engines.values())
        self.programs = ProgramRuns(self.name) if served else None

    # -- the plan --------------------------------------------------------------------
    @property
    def plan(self) -> TracedChain:
        """The current plan's traced graphs (calls in flight keep the plan they started with)."""
        return self._replanner.current.traced

    @property
    def why(self) -> list[str]:
        """What running on the graph gains, by the current plan (empty: calls run as LangChain's)."""
        return self._replanner.current.why

    @property
    def on_graph(self) -> bool:
        return self._replanner.current.on_graph

    @property
    def profiles(self) -> Mapping[str, LatencyProfile]:
        """The profiles the current plan was made with (given, the engines' own, learned)."""
        return self._replanner.current.profiles

    @property
    def learn_after(self) -> int:
        """Calls before the first plan with learned figures (0: the plan never learns: `explain()`
        says why)."""
        return self._replanner.learn_after if self._replanner.learning else 0

    def save_profiles(self, path: str | Path | None = None) -> Path:
        """Write what was learned (to `path`, or the `profiles=` file): a later `optimize(...,
        profiles=path)` starts with it."""
        return self._replanner.save(path)

    # -- structure -------------------------------------------------------------------
    @property
    def _wrapped(self) -> Runnable[Input, Output]:
        return self.original

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        return self.original.get_name(suffix, name=name)

    def get_graph(self, config: RunnableConfig | None = None) -> LCGraph:
        """The original chain's graph (what the user wrote); `explain()` shows Teola's."""
        return self.original.get_graph(config)

    def plan_sections(self, png_dir: str | Path | None = None) -> list[str]:
        """The plan: how calls run, the p-graph, the passes applied and the e-graph, with Mermaid
        (PNGs with `png_dir`), and what was learned of the model servers."""
        plan = explain_plan(
            f"Teola plan for {self.name} (backend {self.backend}, policy {self.policy})",
            self._replanner.first,
            self._replanner.current,
            self._engines.engines,
            self.where(),
            calls=self.learned.calls,
            calls_on_graph=self.calls_on_graph,
            learn_after=self.learn_after,
            not_learning=self._replanner.not_learning,
            png_dir=png_dir,
        )
        return [plan, *self._explain_servers()]

    def _explain_servers(self) -> list[str]:
        """What was learned of the model servers that report their load (none: no section)."""
        lines = [
            f"- {name} (on Teola's graph): {calls.describe()}"
            for name, engine in self._engines.engines.engines.items()
            if (watch := getattr(engine, "load_watch", None)) is not None
            for calls in watch.attached
        ]
        if self.programs is not None:
            lines += [f"- calls run as LangChain runs them: {line}" for line in self.programs.servers()]
        return [section("model servers", "\n".join(lines))] if lines else []

    # -- execution -------------------------------------------------------------------
    async def _execute(
        self, plan: Plan, value: Any, config: RunnableConfig, sync: bool, caller: contextvars.Context
    ) -> Any:
        runtime = self.runtimes.current()
        ctx = QueryContext(uuid4().hex, config, sync, caller, runtime, arrival=now_on(runtime))
        return await run_graph(plan.traced.main, value, ctx)

    def invoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        with self._replanner.calling(asynchronous=False) as plan:
            if kwargs or not plan.on_graph or _loop_running():
                return self.original.invoke(input, config, **kwargs)
            self.calls_on_graph += 1
            config = ensure_config(config)
            caller = contextvars.copy_context()
            return self.sync_thread.run(self._execute(plan, input, config, True, caller))

    async def ainvoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        with self._replanner.calling(asynchronous=True) as plan:
            if kwargs or not plan.on_graph:
                with self._one_program():
                    return await self.original.ainvoke(input, config, **kwargs)
            self.calls_on_graph += 1
            config = ensure_config(config)
            return await self._execute(plan, input, config, False, contextvars.copy_context())

    # -- batch -----------------------------------------------------------------------
    def batch(
        self,
        inputs: list[Input],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Output]:
        if not inputs:
            return []
        with self._replanner.calling(asynchronous=False) as plan:
            if kwargs or not plan.on_graph or _loop_running():
                return self.original.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
            self.calls_on_graph += 1
            configs = get_config_list(config, len(inputs))
            caller = contextvars.copy_context()
            roots = open_roots(self.original, inputs, configs) if self._batches_as_sequence else None
            queries = run_queries(
                plan.traced.main, self.runtimes, inputs, configs, True, caller, roots, return_exceptions
            )
            results, raised = self.sync_thread.run(queries)
            return batch_results(results, raised, roots)

    async def abatch(
        self,
        inputs: list[Input],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Output]:
        if not inputs:
            return []
        with self._replanner.calling(asynchronous=True) as plan:
            if kwargs or not plan.on_graph:
                with self._one_program():
                    return await self.original.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
            self.calls_on_graph += 1
            configs = get_config_list(config, len(inputs))
            caller = contextvars.copy_context()
            roots = await aopen_roots(self.original, inputs, configs) if self._batches_as_sequence else None
            results, raised = await run_queries(
                plan.traced.main, self.runtimes, inputs, configs, False, caller, roots, return_exceptions
            )
            return await abatch_results(results, raised, roots)

    # -- streaming: LangChain's own ----------------------------------------------------
    def stream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Output]:
        yield from self.original.stream(input, config, **kwargs)

    async def astream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Output]:
        gate = self._open_program()
        if gate is None:
            async for chunk in self.original.astream(input, config, **kwargs):
                yield chunk
            return
        try:
            async with contextlib.aclosing(
                gated_chunks(gate, self.original.astream(input, config, **kwargs))
            ) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._close_program(gate)

    @contextlib.contextmanager
    def _one_program(self) -> Iterator[None]:
        """An async call run as LangChain runs it, as one program: its model calls are held
        by a gate of its own while the model's server is saturated, earlier calls first."""
        gate = self._open_program()
        if gate is None:
            yield
            return
        try:
            with holding(CURRENT_GATE, gate):
                yield
        finally:
            self._close_program(gate)

    def _open_program(self) -> RunCalls | None:
        """A gate for a call on the running loop; None without a served model or inside a run."""
        if self.programs is None or CURRENT_GATE.get() is not None:
            return None
        return self.programs.open(asyncio.get_running_loop())

    def _close_program(self, gate: RunCalls) -> None:
        if self.programs is not None:
            self.programs.close(gate)

    def transform(
        self, input: Iterator[Input], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Output]:
        yield from self.original.transform(input, config, **kwargs)

    async def atransform(
        self, input: AsyncIterator[Input], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Output]:
        async for chunk in self.original.atransform(input, config, **kwargs):
            yield chunk

    def astream_log(self, *args: Any, **kwargs: Any) -> Any:
        return self.original.astream_log(*args, **kwargs)

    def astream_events(self, *args: Any, **kwargs: Any) -> Any:
        return self.original.astream_events(*args, **kwargs)


def _loop_running() -> bool:
    """A sync call made on a thread that runs an event loop: it blocks that loop whatever we do,
    and nothing could run beside it there, so it runs as LangChain runs it (no hand-off to
    Teola's loop thread, whose wait would block the caller's loop on a lock)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def optimize(runnable: Runnable[Any, Any] | Any, **options: Any) -> Runnable[Any, Any]:
    """Trace `runnable` (any LangChain runnable, or a dict of them) and return its drop-in.

    (`teola_langchain.optimize` and `teola.optimize` send LangGraph graphs to
    `teola_langchain.langgraph` first.)
    """
    return TeolaRunnable(runnable, **options)
