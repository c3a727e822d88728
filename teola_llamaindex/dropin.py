"""What every LlamaIndex query drop-in shares, on the drop-in kit (`teola_core.dropin.DropIn`).

    class TeolaThing(LlamaIndexDropIn):
        def query(self, q):
            return self.run_sync(lambda ctx: self.run_graph(self.graph, {"query": q}, ctx))

On top of the kit (the original, its engines, one runtime per event loop, the loop thread
of the sync methods, closing, attributes forwarded to the original): the `passes` option
resolved once (`optimize_graph`), graph runs that count themselves (`calls_on_graph`) and
hand back the user's own exception, and opaque calls: the original's own method as the
one step of a graph.

A subclass traces in its `__init__`, then calls `place_traced()`: the `engines=` option
is checked against what was traced and, on the "ray" backend, the engines are placed as
`ray=` says (the framework engines stay in the driver: they are `driver_only`). Each
query's context travels with its calls (`Call.context`), never in a registry.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from teola_core.dropin import DropIn
from teola_core.engines.choices import EngineOption
from teola_core.engines.protocol import EngineSet
from teola_core.explain import graph_sections, section
from teola_core.ir.builder import GraphBuilder
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.passes import run_passes
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import DEFAULT_BACKEND, check_backend
from teola_core.runtime.parts import SharedOptions
from teola_core.runtime.ray.options import RayOptions
from teola_llamaindex.common import unwrap_error
from teola_llamaindex.prefix_warmup import warmup_notes
from teola_llamaindex.registry import EngineRegistry, engine_choices
from teola_llamaindex.scope import CallerLoop, CallerThread, QueryContext

T = TypeVar("T")


class LlamaIndexDropIn(DropIn):
    """The plumbing of a drop-in (see the module docstring); subclasses trace and call.

    Options: backend ("local", scheduled and batching; "ray", engines in Ray actors; or
    "reference"), policy (the local runtime's engine scheduling policy), passes (True, False
    or a `PassManager`), profiles (latency profiles by engine name, e.g. "llm:MockLLM", for
    the passes to plan with), warm_prefix (warm a split prompt's ready prefix on a vLLM
    server, `prefix_warmup`), decompose (None, the default: split the components whose
    spans, events and callbacks Teola then emits as plain, a `VectorIndexRetriever`; True:
    also those whose records then differ, synthesizers and `QueryFusionRetriever`; False:
    none; docs/llamaindex.md, "Decomposed components"), engines (which Teola engine runs a
    component: `(component, engine)` pairs or a chooser, `registry`), ray (where engines
    run on the "ray" backend: `teola_core.runtime.ray.options.RayOptions`, or a dict
    `{"address": ..., "engines": {...}}`).
    """

    def __init__(
        self,
        original: Any,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        passes: Any = True,
        profiles: Mapping[str, LatencyProfile] | None = None,
        warm_prefix: bool = True,
        decompose: bool | None = None,
        engines: EngineOption = None,
        ray: RayOptions | Mapping[str, Any] | None = None,
    ) -> None:
        check_backend(backend, ray)
        self.original = original
        self.backend = backend
        self.policy = policy
        self.decompose = decompose
        self.calls_on_graph = 0  # graph runs so far (opaque ones included)
        self._passes = passes
        self._profiles = dict(profiles or {})
        self._shared = SharedOptions(engine_choices(engines), backend, ray)
        self._engines = EngineRegistry(self._shared.choices, warm_prefix=warm_prefix)
        self.start_sync_thread(f"teola:{type(original).__name__}")
        self._ids = itertools.count()

    def part_options(self) -> dict[str, Any]:
        """The options of a drop-in for a part of this object (`engines=` and `ray=` shared)."""
        return {"backend": self.backend, "policy": self.policy, **self._shared.part_options()}

    def place_traced(self, parts: Sequence[LlamaIndexDropIn] = ()) -> None:
        """After tracing: check `engines=` and `ray=` (against `parts` too) and place the engines."""
        self._shared.check([self._engines.engines, *(p.engine_set for p in parts)])
        super().place_engines(self._engines.engines, backend=self.backend, policy=self.policy, ray=self._shared.ray)

    # -- the shared surface ---------------------------------------------------------------
    @property
    def engine_set(self) -> EngineSet:
        """The engines the traced object runs on (as traced: known before they are placed)."""
        return self._engines.engines

    def explain_sections(
        self, name: str, pgraph: Graph, graph: Graph, passes: list[str], png_dir: str | Path | None = None
    ) -> list[str]:
        """`explain()`'s sections on a traced graph: engines (where they run, prefix warm-ups), the
        p-graph, passes, e-graph and its Mermaid (PNG with `png_dir`)."""
        where = self.where()
        engines = [f"- {engine} ({where[engine]})" for engine in self._engines.engines.engines]
        notes = [f"- {note}" for note in warmup_notes(self._engines.engines)]
        return [
            section("engines", "\n".join([*engines, *notes]) or "- none"),
            *graph_sections(name, pgraph, passes, graph, png_dir),
        ]

    # -- running --------------------------------------------------------------------------
    def optimize_graph(self, pgraph: Graph) -> tuple[Graph, list[str]]:
        """The e-graph of a traced graph under this drop-in's `passes` and `profiles`."""
        return run_passes(pgraph, self._passes, {**self._engines.engines.profiles(), **self._profiles})

    async def run_graph(self, graph: Graph, inputs: Mapping[str, Any], ctx: QueryContext) -> dict[str, Any]:
        """One run of `graph` (its `context` input is `ctx`); raises the user's own exception,
        once what its steps opened (a retriever's spans, `retrieval_spans`) is closed with it."""
        qid = f"li{next(self._ids)}"
        self.calls_on_graph += 1
        try:
            return await self.runtimes.current().run(graph, {**inputs, "context": ctx}, query_id=qid, context=ctx)
        except PrimitiveError as exc:
            error = unwrap_error(exc, {n.id: n.module or "" for n in graph.nodes.values()})
        except BaseException as exc:  # cancelled, or the runtime closed
            ctx.fail(exc)
            raise
        ctx.fail(error)
        raise error

    def run_sync(self, work: Callable[[QueryContext], Awaitable[T]]) -> T:
        """`work(ctx)` for a sync call; the framework's sync calls run on the calling thread.

        The graph runs on an event loop of the calling thread that the call drives
        (`CallerLoop`); where that thread already runs a loop (a sync call from async
        code), on this object's loop thread while the caller serves its calls (`CallerThread`).
        """
        if CallerLoop.usable():
            loop = CallerLoop()
            return loop.drive(_awaited(work(QueryContext(sync=True, caller=loop))))
        caller = CallerThread()
        return caller.serve(self.sync_thread.submit(_awaited(work(QueryContext(sync=True, caller=caller)))))

    def call_opaque(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` (the original's sync method) as the one step of a graph."""
        thunk = functools.partial(fn, *args, **kwargs)
        return self.run_sync(lambda ctx: self._opaque(thunk, ctx))

    async def acall_opaque(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """`await fn(*args, **kwargs)` (the original's async method) as the one step of a graph."""
        return await self._opaque(functools.partial(fn, *args, **kwargs), QueryContext(sync=False))

    async def _opaque(self, thunk: Callable[[], Any], ctx: QueryContext) -> Any:
        return (await self.run_graph(_OPAQUE, {"thunk": thunk}, ctx))["result"]


D = TypeVar("D", bound=LlamaIndexDropIn)


def weak_drop_in(drop_in: D) -> Callable[[], D]:
    """A weak reference for a view's hooks (the view must not keep its drop-in alive)."""
    ref = weakref.ref(drop_in)

    def get() -> D:
        alive = ref()
        if alive is None:
            raise RuntimeError("this view belongs to a Teola drop-in that no longer exists")
        return alive

    return get


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _run_thunk(thunk: Callable[[], Any], ctx: QueryContext) -> Any:
    return await ctx.blocking(thunk) if ctx.sync else await ctx.awaiting(thunk())


def _opaque_graph() -> Graph:
    b = GraphBuilder("opaque")
    ctx, thunk = b.input("context"), b.input("thunk")
    b.output(result=b.call(_run_thunk, {"thunk": thunk, "ctx": ctx}, name="run"))
    return b.build()


_OPAQUE = _opaque_graph()
