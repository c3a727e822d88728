"""`optimize(chain)`: a drop-in LangChain `Runnable` that runs the chain on Teola.

    from teola import optimize
    fast = optimize(chain)                    # traced once, here; nothing runs yet
    fast.invoke({"question": "..."})          # same result, runs and callbacks as chain.invoke
    await fast.abatch(questions, {"max_concurrency": 8})
    print(fast.explain())                     # the plan: graphs, passes, engines

What runs: the traced graph (`tracer.py`) on the runtime backend, every step through its
own method with the config LangChain would give it, every composite's callback run
opened and closed as LangChain's code does — so results, errors, callbacks and traces
are the chain's own. A chain with no model, embedding or search in it (nothing Teola's
engines could schedule) simply runs as LangChain runs it. `stream`, `astream`,
`transform`, `astream_events` and `astream_log` run through LangChain's own streaming of
the chain, so every chunk and event is LangChain's.

`batch`/`abatch` run every input as a concurrent query on one runtime (so the engine
schedulers can batch across them) with LangChain's batch contract: a sequence opens
every input's run first; errors are returned in place (`return_exceptions=True`) or the
error LangChain would raise is raised (the first failing step, then the first input).

Sync methods run the graph on an event loop the runnable owns in a daemon thread (one
per runnable, started on first use; `close()` stops it), and the steps' sync methods in
worker threads, as LangChain's sync path runs them; async methods run on the caller's
loop. There is no global state.

Plans learn (`learning.py`): every call — on the graph or as LangChain runs it — reports
each step's run time, the items list parsers produce, and the engines' batch times.
After `learn` calls, and whenever those figures change materially, the chain is traced
and optimized again with them (given profiles win over learned ones), so a chain that
started as LangChain runs it moves to the graph once a pass is seen to pay. A call runs
on the plan it started with; a plan never changes a result. With `profiles="app.json"`
what was learned is read at start and written at each new plan (and `save_profiles()`).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

from langchain_core.runnables import Runnable, RunnableConfig, RunnableSequence
from langchain_core.runnables.base import Input, Output, coerce_to_runnable
from langchain_core.runnables.config import (
    CallbackManager,
    ensure_config,
    get_async_callback_manager_for_config,
    get_config_list,
)
from langchain_core.runnables.graph import Graph as LCGraph

from teola_core.engines.protocol import EngineSet
from teola_core.ir.draw import draw_graph
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.learning import LatencyBook, differs, merged
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import BACKENDS, DEFAULT_BACKEND, RuntimePerLoop
from teola_core.runtime.base import RuntimeHook
from teola_core.runtime.dropin import DropInBase
from teola_langchain.batching import BatchGroup
from teola_langchain.classes import class_of
from teola_langchain.context import OpenRun, QueryContext
from teola_langchain.engines import EngineChoices, EngineOption, EngineRegistry, LangChainLLMEngine
from teola_langchain.explain import mermaid, section
from teola_langchain.keys import last_name
from teola_langchain.learning import AsyncObserver, Observer, SpanLearner, observing
from teola_langchain.patched import runs_own_code
from teola_langchain.plan_report import measured, report, seconds
from teola_langchain.session import TraceSession
from teola_langchain.steps import run_graph
from teola_langchain.traced import SubGraph, TracedChain
from teola_langchain.tracer import trace_in

log = logging.getLogger("teola.langchain")

LEARN_AFTER = 3  # calls before the first plan with learned figures
MIN_SAMPLES = 3  # observations of a step before its median is used
OBSERVE_EVERY = 4  # once learned, one call in this many is timed ...
OBSERVE_EVERY_MAX = 64  # ... doubling up to this while what is observed changes no plan


@dataclass(frozen=True)
class Plan:
    """One plan of the chain: what runs, whether calls run on the graph, and what it was planned with.

    profiles: every profile the passes read (given, the engines' own, learned);
    learned/counts: the learned figures among them (to tell when a new plan is due);
    calls: how many calls had been observed when it was made.
    """

    traced: TracedChain
    why: list[str]
    on_graph: bool
    profiles: Mapping[str, LatencyProfile]
    learned: Mapping[str, LatencyProfile]
    counts: Mapping[str, int]
    calls: int
    given: frozenset[str] = frozenset()  # the keys of the given profiles (the engines' own included)


class TeolaRunnable(DropInBase, Runnable[Input, Output]):
    """A LangChain runnable that runs a traced chain on Teola (see the module docstring).

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
        ray: where engines run on the "ray" backend (`teola_core.runtime.ray_options.RayOptions`,
            or a dict: `{"address": ..., "engines": {name or class: {"num_replicas": 2, ...}}}`).
        execution: "auto" (the default: calls run on Teola's graph when the chain has a
            model, embedding or search for its engines to schedule, else as LangChain
            runs them) or "graph" (always on the graph, e.g. to check a chain's trace).
    """

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
        self.learn_after = 0 if learn is False else LEARN_AFTER if learn is True else int(learn)
        self.profiles_path = Path(profiles) if isinstance(profiles, (str, Path)) else None
        self.learned = LatencyBook()
        if self.profiles_path is not None and self.profiles_path.exists():
            self.learned = LatencyBook.load(self.profiles_path)
        self._passes = passes
        self._execution = execution
        self._timeout = timeout
        self._expected_items = expected_items
        choices = EngineChoices(engines)
        self._engines = EngineRegistry(choices)
        self._given: Mapping[str, LatencyProfile] = profiles if isinstance(profiles, Mapping) else {}
        self._plan = self._first = self._make_plan(warn=warn)
        if not self._plan.traced.uses_engines:  # only engine calls' latencies can change a plan
            self.learn_after = 0
        choices.check_used()
        self._replanning = threading.Lock()
        self._started = itertools.count()  # calls started (which are observed: `_observed`)
        self._observe_every = OBSERVE_EVERY
        self._looked_at = -1  # the book's version at the last look for a new plan
        self._clock = time.perf_counter  # what observations are timed with (tests give a virtual clock)
        self._batches_as_sequence = class_of(original) is RunnableSequence and runs_own_code(original, RunnableSequence)
        learner = (SpanLearner(self.learned),) if self._learning() else ()
        self.runtimes = RuntimePerLoop(
            self._engines.engines, backend, policy, (*hooks, *learner), ray=ray, timeouts=timeout
        )
        self.start_sync_thread(f"teola:{self.name}")
        self.calls_on_graph = 0  # calls that ran on Teola's graph (the rest ran as LangChain runs them)

    # -- the plan --------------------------------------------------------------------
    @property
    def plan(self) -> TracedChain:
        """The current plan's traced graphs (calls in flight keep the plan they started with)."""
        return self._plan.traced

    @property
    def why(self) -> list[str]:
        """What running on the graph gains, by the current plan (empty: calls run as LangChain's)."""
        return self._plan.why

    @property
    def on_graph(self) -> bool:
        return self._plan.on_graph

    @property
    def profiles(self) -> Mapping[str, LatencyProfile]:
        """The profiles the current plan was made with (given, the engines' own, learned)."""
        return self._plan.profiles

    def _learning(self) -> bool:
        return self.learn_after > 0

    def _make_plan(self, *, warn: bool = False) -> Plan:
        """Trace the chain and optimize it with the given, the engines' and the learned profiles."""
        learned = self.learned.profiles(MIN_SAMPLES) if self._learning() else {}
        counts = self.learned.counts(MIN_SAMPLES) if self._learning() else {}
        session = TraceSession(
            self._engines, warn=warn, expected_items=self._expected_items, counts=counts.get if counts else None
        )
        traced = trace_in(session, self.original)
        given = {**self._engines.engines.profiles(), **_by_key(self._given, traced.steps)}
        profiles = merged(given, learned)
        for sub in traced.graphs():
            _optimize_graph(sub, self._passes, profiles)
        why = _what_pays(traced, self._engines.engines)
        if self._timeout is not None:
            why.append(f"every step and engine call has a {self._timeout} s deadline")
        on_graph = self._execution == "graph" or bool(why)
        return Plan(traced, why, on_graph, profiles, learned, counts, self.learned.calls, frozenset(given))

    def _call_done(self) -> None:
        """A call finished: re-plan when due (see the module docstring). Never raises into the call."""
        calls = self.learned.call_done()
        if not self._learning() or calls < self.learn_after or not self._replanning.acquire(blocking=False):
            return
        try:
            if self.learned.version == self._looked_at:
                return
            self._looked_at = self.learned.version
            plan = self._plan
            learned, counts = self.learned.profiles(MIN_SAMPLES), self.learned.counts(MIN_SAMPLES)
            if differs(plan.learned, learned) or plan.counts != counts:
                self._plan = self._make_plan()
                self._observe_every = OBSERVE_EVERY
                if self.profiles_path is not None:
                    self.learned.save(self.profiles_path)
            else:
                self._observe_every = min(2 * self._observe_every, OBSERVE_EVERY_MAX)
        except Exception:  # the call itself succeeded or failed on its own: learning stops, loudly
            self.learn_after = 0
            log.exception("teola: %s stops learning (its current plan stays); the error was", self.name)
        finally:
            self._replanning.release()

    @contextmanager
    def _calling(self, *, asynchronous: bool) -> Iterator[Plan]:
        """One call: the plan it runs on (the current one, kept to its end), timed when due
        (`_observed`), then a look at whether a new plan is due (`_call_done`)."""
        plan = self._plan
        try:
            with self._observed(asynchronous):
                yield plan
        finally:
            self._call_done()

    def _observed(self, asynchronous: bool) -> AbstractContextManager[None]:
        """Where this call's runs are timed (see `learning.py`): every call until the first learned
        plan, then one in `OBSERVE_EVERY`, fewer while observations change no plan (a callback
        handler costs every run a little); none when not learning."""
        started = next(self._started)
        if not self._learning() or (started >= self.learn_after and started % self._observe_every):
            return nullcontext()
        return observing((AsyncObserver if asynchronous else Observer)(self.learned, self._clock))

    def save_profiles(self, path: str | Path | None = None) -> Path:
        """Write what was learned (to `path`, or the `profiles=` file): a later `optimize(...,
        profiles=path)` starts with it."""
        target = Path(path) if path is not None else self.profiles_path
        if target is None:
            raise ValueError("save_profiles(): give a path (this runnable was not given profiles='file.json')")
        self.learned.save(target)
        return target

    # -- structure -------------------------------------------------------------------
    @property
    def InputType(self) -> Any:
        return self.original.InputType

    @property
    def OutputType(self) -> Any:
        return self.original.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.original.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.original.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self.original.config_specs

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        return self.original.get_name(suffix, name=name)

    def get_graph(self, config: RunnableConfig | None = None) -> LCGraph:
        """The original chain's graph (what the user wrote); `explain()` shows Teola's."""
        return self.original.get_graph(config)

    def explain(self, png_dir: str | Path | None = None) -> str:
        """The plan: how calls run, the p-graph, the passes applied and the e-graph, with Mermaid.

        With `png_dir`, each e-graph is also drawn as a PNG there (matplotlib).
        """
        out = [f"Teola plan for {self.name} (backend {self.backend}, policy {self.policy})\n"]
        if self.on_graph:
            how = (
                "invoke/ainvoke/batch/abatch run on Teola's graph ("
                + ("; ".join(self.why) or "execution='graph'")
                + "); streams run as LangChain streams the chain"
            )
        else:
            how = (
                "nothing here would run sooner on Teola's graph (no pass applies, no engine batches across "
                "queries): every call runs as LangChain runs it"
            )
        out.append(section("execution", how))
        advice = report(
            self._first, self._plan, self._engines.engines, self.learned.calls, self.calls_on_graph, self.learn_after
        )
        out.extend(section(title, body) for title, body in advice)
        where = self.where()
        engines = [
            f"- {name}: {type(e).__name__}" + (f" ({where[name]})" if name in where else "")
            for name, e in self._engines.engines.engines.items()
        ]
        out.append(section("engines (profiles are keyed by these names)", "\n".join(engines) or "- none"))
        out.append(section("steps (profiles are keyed by these names, or a step's own name)", self._steps_text()))
        for sub in self.plan.graphs():
            out.append(section(f"p-graph {sub.name}", sub.pgraph.summary()))
            out.append(section(f"passes applied to {sub.name}", "\n".join(f"- {p}" for p in sub.passes) or "- none"))
            out.append(section(f"e-graph {sub.name}", sub.graph.summary()))
            out.append(section(f"mermaid {sub.name}", mermaid(sub.graph)))
            if png_dir is not None:
                path = draw_graph(sub.graph, Path(png_dir) / f"{_file_name(sub.name)}-egraph.png")
                out.append(section(f"picture {sub.name}", str(path)))
        return "\n".join(out)

    def _steps_text(self) -> str:
        lines = []
        for key, info in self.plan.steps.items():
            timed = measured(self.profiles, key)
            learned = key not in self._plan.given
            how = f"{seconds(timed)} ({'learned' if learned else 'given'})" if timed is not None else "no time yet"
            count = self._plan.counts.get(key)
            items = f", writes {count} items" if count is not None else ""
            lines.append(f"- {key}: {info.what}, {how}{items}")
        return "\n".join(lines) or "- none"

    # -- execution -------------------------------------------------------------------
    async def _execute(
        self, plan: Plan, value: Any, config: RunnableConfig, sync: bool, caller: contextvars.Context
    ) -> Any:
        ctx = QueryContext(uuid4().hex, config, sync, caller, self.runtimes.current())
        return await run_graph(plan.traced.main, value, ctx)

    def invoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        with self._calling(asynchronous=False) as plan:
            if kwargs or not plan.on_graph or _loop_running():
                return self.original.invoke(input, config, **kwargs)
            self.calls_on_graph += 1
            config = ensure_config(config)
            caller = contextvars.copy_context()
            return self.sync_thread.run(self._execute(plan, input, config, True, caller))

    async def ainvoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        with self._calling(asynchronous=True) as plan:
            if kwargs or not plan.on_graph:
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
        with self._calling(asynchronous=False) as plan:
            if kwargs or not plan.on_graph or _loop_running():
                return self.original.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
            self.calls_on_graph += 1
            configs = get_config_list(config, len(inputs))
            caller = contextvars.copy_context()
            roots = self._open_roots(inputs, configs) if self._batches_as_sequence else None
            gathered = self._gather(plan, inputs, configs, True, caller, roots, return_exceptions)
            results, raised = self.sync_thread.run(gathered)
            return self._batch_results(results, raised, roots)

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
        with self._calling(asynchronous=True) as plan:
            if kwargs or not plan.on_graph:
                return await self.original.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
            self.calls_on_graph += 1
            configs = get_config_list(config, len(inputs))
            caller = contextvars.copy_context()
            roots = await self._aopen_roots(inputs, configs) if self._batches_as_sequence else None
            results, raised = await self._gather(plan, inputs, configs, False, caller, roots, return_exceptions)
            return await self._abatch_results(results, raised, roots)

    def _open_roots(self, inputs: list[Any], configs: list[RunnableConfig]) -> list[OpenRun]:
        """Every input's sequence run, opened before any step runs (`RunnableSequence.batch`)."""
        roots = []
        for value, config in zip(inputs, configs, strict=True):
            manager = CallbackManager.configure(
                inheritable_callbacks=config.get("callbacks"),
                inheritable_tags=config.get("tags"),
                inheritable_metadata=config.get("metadata"),
            )
            run = manager.on_chain_start(
                None, value, name=config.get("run_name") or self.original.get_name(), run_id=config.pop("run_id", None)
            )
            roots.append(OpenRun(run, config, None))
        return roots

    async def _aopen_roots(self, inputs: list[Any], configs: list[RunnableConfig]) -> list[OpenRun]:
        roots = []
        for value, config in zip(inputs, configs, strict=True):
            manager = get_async_callback_manager_for_config(config)
            run = await manager.on_chain_start(
                None, value, name=config.get("run_name") or self.original.get_name(), run_id=config.pop("run_id", None)
            )
            roots.append(OpenRun(run, config, None))
        return roots

    async def _gather(
        self,
        plan: Plan,
        inputs: Sequence[Any],
        configs: Sequence[RunnableConfig],
        sync: bool,
        caller: contextvars.Context,
        roots: list[OpenRun] | None,
        return_exceptions: bool,
    ) -> tuple[list[Any], BaseException | None]:
        """Every input as a query; (results or errors in place, the error the batch raises)."""
        limit = configs[0].get("max_concurrency")
        semaphore = asyncio.Semaphore(limit) if limit else None
        group = BatchGroup(len(inputs), return_exceptions) if roots is not None else None
        runtime = self.runtimes.current()
        contexts = [
            QueryContext(
                uuid4().hex,
                configs[i],
                sync,
                caller.copy(),
                runtime,
                root_run=None if roots is None else roots[i],
                batch=group,
                batch_index=i,
            )
            for i in range(len(inputs))
        ]

        async def one(i: int) -> Any:
            try:
                if semaphore is None:
                    return await run_graph(plan.traced.main, inputs[i], contexts[i])
                async with semaphore:
                    return await run_graph(plan.traced.main, inputs[i], contexts[i])
            except BaseException:
                if group is not None:
                    group.leave(i)
                raise

        results = list(await asyncio.gather(*(one(i) for i in range(len(inputs))), return_exceptions=True))
        failed = [
            (contexts[i].step, i)
            for i, r in enumerate(results)
            if isinstance(r, BaseException) and (not return_exceptions or not isinstance(r, Exception))
        ]
        return results, results[min(failed)[1]] if failed else None

    def _batch_results(
        self, results: list[Any], raised: BaseException | None, roots: list[OpenRun] | None
    ) -> list[Any]:
        if roots is not None:
            for run, result in zip(roots, results, strict=True):
                error = raised or (result if isinstance(result, BaseException) else None)
                if error is not None:
                    run.manager.on_chain_error(error)
                else:
                    run.manager.on_chain_end(result)
        if raised is not None:
            raise raised
        return results

    async def _abatch_results(
        self, results: list[Any], raised: BaseException | None, roots: list[OpenRun] | None
    ) -> list[Any]:
        if roots is not None:
            ends = []
            for run, result in zip(roots, results, strict=True):
                error = raised or (result if isinstance(result, BaseException) else None)
                ends.append(
                    run.manager.on_chain_error(error) if error is not None else run.manager.on_chain_end(result)
                )
            await asyncio.gather(*ends)
        if raised is not None:
            raise raised
        return results

    # -- streaming: LangChain's own ----------------------------------------------------
    def stream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Output]:
        yield from self.original.stream(input, config, **kwargs)

    async def astream(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Output]:
        async for chunk in self.original.astream(input, config, **kwargs):
            yield chunk

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


_PAYING_PASSES = ("decode-pipelining", "stage-decomposition")


def _what_pays(plan: TracedChain, engines: EngineSet) -> list[str]:
    """What running on the graph gains over running the chain as LangChain does (empty: nothing).

    A pass that overlaps work, or an engine that batches calls across queries. A chain of
    framework calls that each run alone gains nothing from being scheduled, so it is not.
    A prefill split pays only on an engine that prefills a prompt's start for real (not a
    LangChain model with no server to warm: its early prefill is bookkeeping).
    """
    gains = [
        f"prefill-split on {sub.name} ({', '.join(sorted(warmed))})"
        for sub in plan.graphs()
        if (warmed := {n.engine for n in sub.graph.nodes.values() if _warms(n, engines)})
    ]
    gains += [
        f"{name} on {sub.name}"
        for sub in plan.graphs()
        for name in _PAYING_PASSES
        if any(p == f"applied {name}" for p in sub.passes)
    ]
    used = {n.engine for sub in plan.graphs() for n in sub.graph.nodes.values() if n.engine is not None}
    for name in sorted(used):
        if engines[name].limits.max_batch_items != 1:
            gains.append(f"{name} batches calls across queries")
    return gains


def _warms(node: Any, engines: EngineSet) -> bool:
    """A partial prefill on an engine that computes it (see `_what_pays`)."""
    if node.kind != PrimitiveKind.PARTIAL_PREFILL or node.engine is None:
        return False
    engine = engines[node.engine]
    return not isinstance(engine, LangChainLLMEngine) or engine.warmer is not None


def _by_key(given: Mapping[str, LatencyProfile], steps: Mapping[str, str]) -> dict[str, LatencyProfile]:
    """Given profiles by the keys the plan uses: a step may be named by its own run name when
    no other step has that name (`keys.last_name`); any other name is used as it is."""
    out: dict[str, LatencyProfile] = {}
    for name, profile in given.items():
        if name in steps or ":" in name:
            out[name] = profile
            continue
        matches = [key for key in steps if last_name(key) == name]
        if len(matches) > 1:
            raise ValueError(
                f"profiles=: {len(matches)} steps are named {name!r}; give one of their keys instead: "
                + ", ".join(matches)
            )
        out[matches[0] if matches else name] = profile
    return out


def _loop_running() -> bool:
    """A sync call made on a thread that runs an event loop: it blocks that loop whatever we do,
    and nothing could run beside it there, so it runs as LangChain runs it (no hand-off to
    Teola's loop thread, whose wait would block the caller's loop on a lock)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "graph"


def _optimize_graph(sub: SubGraph, passes: Any, profiles: Mapping[str, LatencyProfile]) -> None:
    """Run the pass pipeline on one traced graph."""
    if passes is False:
        sub.passes = ["(passes disabled)"]
        return
    from teola_core.passes import PassContext, PassManager

    manager = passes if isinstance(passes, PassManager) else PassManager()
    result = manager.optimize(sub.pgraph, PassContext(profiles=profiles))
    sub.graph = result.e_graph
    sub.passes = [*(f"applied {name}" for name in result.applied), *result.notes]


def optimize(runnable: Runnable[Any, Any] | Any, **options: Any) -> Runnable[Any, Any]:
    """Trace `runnable` (any LangChain runnable, or a dict of them) and return its drop-in.

    (`teola_langchain.optimize` and `teola.optimize` send LangGraph graphs to
    `teola_langchain.langgraph` first.)
    """
    return TeolaRunnable(runnable, **options)
