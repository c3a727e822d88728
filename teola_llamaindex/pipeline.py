"""Trace a `QueryPipeline` (llama-index-core <= 0.12) into a Teola graph, and run it.

    from teola import optimize
    fast = optimize(pipeline)              # or TeolaQueryPipelineExecutor(pipeline)
    fast.run(topic="cats") == pipeline.run(topic="cats")
    await fast.arun(input=["a", "b"], batch=True)

What QueryPipeline computes (its `_run_multi`/`_arun_multi`), and how it is traced:

- A module runs once all its free required input keys have arrived; it runs with the
  keys that arrived by then. Its *wave* is therefore fixed by the DAG: 0 for a module
  with no required links (roots, argument packs), else one more than the latest wave
  of its required inputs' sources. A link into an optional key delivers only if its
  source runs in an earlier wave (a later one finds the module already run), so Teola
  adds exactly the delivering links and never waits for the others. A module gets its
  arrived keys in arrival order (wave, module order, edge order); a later arrival for
  the same key overwrites, as in LlamaIndex.
- Each link is an inline primitive: `get_output(src_key, outputs)`, then `input_fn`,
  then `condition_fn`; a failed condition yields `SKIPPED`. A module with a skipped
  required input never runs (its value is `SKIPPED`), nor do the modules behind it.
- Modules, by class: `LLMCompleteComponent` (not streaming) -> PREFILL + DECODE on the
  user's LLM; `PromptComponent` over a plain `PromptTemplate` -> FORMAT with its
  literal/variable segments (so prefill split can prefill a ready prefix), rendered
  with LlamaIndex's own `SafeFormatter` rules; `RetrieverComponent` over a
  `VectorIndexRetriever` -> EMBED + SEARCH, over a `QueryFusionRetriever` -> query
  generation, per-query EMBED + SEARCH and fusion (`retrievers`); `PostprocessorComponent` over
  a reranking postprocessor -> RERANK (`rerank`); `SynthesizerComponent` over a compact,
  simple_summarize or refine synthesizer -> plan + FORMAT + LLM, or the whole synthesizer
  where that one call is needed (`synthesis`; its `query_str` reaches the FORMAT as soon
  as its link delivers); every other module (input, argument packs, filtering
  postprocessors, other synthesizers, `FnComponent`, unknown classes) -> one
  `call` running the component itself (`run_component` in a worker thread for sync
  calls, `arun_component` for async ones; `FnComponent` and unknown classes warn once
  with `OpaqueModuleWarning`). Each module's input validation and output validation
  are LlamaIndex's own (`validate_component_inputs/outputs`). Modules that a condition
  may skip always run as one call.
- The result is composed as LlamaIndex composes it: the outputs of the leaves that
  ran, in run order, plus the last module of the last wave; intermediates as in
  `run_with_intermediates` (the async variant's reuse of the wave's last input dict
  included).

Not traceable, so the original executor runs it (a warning at construction, and
`explain()` says why): cycles, a required key fed by no link or by several links, a
link without `dest_key` into a module with other than one free key, an optional link
from a module of the same wave (the sync and async executors differ there). Calls with
a `callback_manager` also run on the original executor.

Unlike QueryPipeline's executor (waves; the next wave waits for the whole wave), each
primitive starts when its own inputs are ready, and concurrent runs (`batch=True`, or
many callers) share engine schedulers and batch.
"""

from __future__ import annotations

import asyncio
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from llama_index.core.base.base_retriever import RetrieverComponent
from llama_index.core.base.query_pipeline.query import (
    ComponentIntermediates,
    QueryComponent,
    validate_and_convert_stringable,
)
from llama_index.core.llms.llm import LLMCompleteComponent, default_completion_to_prompt
from llama_index.core.postprocessor.types import PostprocessorComponent
from llama_index.core.prompts.base import PromptComponent, PromptTemplate
from llama_index.core.query_pipeline import QueryPipeline
from llama_index.core.query_pipeline.components.argpacks import ArgPackComponent, KwargPackComponent
from llama_index.core.query_pipeline.components.input import InputComponent
from llama_index.core.query_pipeline.query import get_output
from llama_index.core.response_synthesizers.base import SynthesizerComponent

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import PrimitiveError
from teola_core.ir.graph import Graph
from teola_core.profiles.profile import LatencyProfile
from teola_core.runtime.backends import BACKENDS, DEFAULT_BACKEND, RuntimePerLoop
from teola_core.runtime.loop_thread import LoopThread
from teola_llamaindex.common import SKIPPED, OpaqueModuleWarning, QueryContext, unwrap_error
from teola_llamaindex.engines import EngineRegistry
from teola_llamaindex.formatting import segments_of
from teola_llamaindex.openai_compat import warmup_notes
from teola_llamaindex.optimizing import optimize_graph
from teola_llamaindex.rerank import reranks, trace_rerank
from teola_llamaindex.retrievers import trace_retriever, traceable
from teola_llamaindex.synthesis import max_tokens_hint, trace_synthesis, why_opaque

# Components whose run is cheap and pure: run inline, the same for sync and async calls.
_INLINE = (InputComponent, ArgPackComponent, KwargPackComponent)
# Known components run as one call without a warning (they do their own engine calls).
_KNOWN = (*_INLINE, PostprocessorComponent, SynthesizerComponent, QueryPipeline, LLMCompleteComponent)


class UnsupportedPipeline(Exception):
    """The pipeline's semantics cannot be reproduced as a graph; the original executor runs it."""


@dataclass(frozen=True)
class _Link:
    src: str
    dest: str
    src_key: str | None
    dest_key: str
    required: bool
    condition_fn: Callable[[Any], Any] | None
    input_fn: Callable[[Any], Any] | None
    order: tuple[int, int, int]  # arrival order: (wave of src, module index of src, edge index)


@dataclass
class PipelinePlan:
    """The traced pipeline: its graphs and the facts the result is composed from."""

    pgraph: Graph
    graph: Graph
    waves: dict[str, int]
    index: dict[str, int]
    leaves: frozenset[str]
    opaque: list[str]
    passes: list[str] = field(default_factory=list)

    def compose(
        self, outs: Mapping[str, Any], ins: Mapping[str, Any], *, sync: bool
    ) -> tuple[dict[str, Any], dict[str, ComponentIntermediates]]:
        """`result_outputs` and intermediates exactly as QueryPipeline's run loop builds them."""
        executed = sorted(outs, key=lambda m: (self.waves[m], self.index[m]))
        result = {m: outs[m] for m in executed if m in self.leaves}
        last = executed[-1]
        result[last] = outs[last]
        last_of_wave = {self.waves[m]: m for m in executed}
        intermediates = {
            m: ComponentIntermediates(inputs=ins[m] if sync else ins[last_of_wave[self.waves[m]]], outputs=outs[m])
            for m in executed
        }
        return result, intermediates


def trace_pipeline(pipeline: QueryPipeline, engines: EngineRegistry, *, warn: bool = True) -> PipelinePlan:
    """The pipeline as a Teola graph (see the module docstring); raises `UnsupportedPipeline`."""
    modules: dict[str, QueryComponent] = dict(pipeline.module_dict)
    dag = pipeline.dag
    if not modules:
        raise UnsupportedPipeline("the pipeline has no modules")
    if not nx.is_directed_acyclic_graph(dag):
        raise UnsupportedPipeline("the pipeline's DAG has a cycle")
    index = {m: i for i, m in enumerate(modules)}
    roots = {m for m, d in dag.in_degree() if d == 0}
    leaves = frozenset(m for m, d in dag.out_degree() if d == 0)
    topo = list(nx.topological_sort(dag))

    raw: dict[str, list[tuple[str, dict[str, Any], int]]] = {m: [] for m in modules}
    for src in modules:
        for e, (_, dest, attrs) in enumerate(dag.edges(src, data=True)):
            raw[dest].append((src, attrs, e))

    waves: dict[str, int] = {}
    links: dict[str, list[_Link]] = {}
    for m in topo:
        free = modules[m].free_req_input_keys
        resolved = []
        for src, attrs, e in raw[m]:
            dest_key = attrs.get("dest_key")
            if dest_key is None:
                if len(free) != 1:
                    raise UnsupportedPipeline(f"link {src} -> {m} has no dest_key and {m} has {len(free)} free keys")
                dest_key = next(iter(free))
            resolved.append((src, attrs, e, dest_key, dest_key in free))
        required = [r for r in resolved if r[4]]
        if m not in roots:
            for key in free:
                providers = [r for r in required if r[3] == key]
                if len(providers) != 1:
                    raise UnsupportedPipeline(f"required key {key!r} of module {m} has {len(providers)} links")
        waves[m] = 1 + max((waves[r[0]] for r in required), default=-1)
        links[m] = []
        for src, attrs, e, dest_key, is_required in resolved:
            if not is_required and waves[src] >= waves[m]:
                if waves[src] == waves[m]:
                    raise UnsupportedPipeline(f"optional link {src} -> {m} within one wave")
                continue  # arrives after the module ran: never delivered
            links[m].append(
                _Link(
                    src,
                    m,
                    attrs.get("src_key"),
                    dest_key,
                    is_required,
                    attrs.get("condition_fn"),
                    attrs.get("input_fn"),
                    (waves[src], index[src], e),
                )
            )
        links[m].sort(key=lambda link: link.order)

    skippable: set[str] = set()
    for m in topo:
        if any(link.required and (link.condition_fn is not None or link.src in skippable) for link in links[m]):
            skippable.add(m)

    b = GraphBuilder(f"QueryPipeline:{pipeline.__class__.__name__}")
    ctx = b.input("context")
    inputs = b.input("inputs")
    outs: dict[str, Value] = {}
    ins: dict[str, Value] = {}
    formats: dict[str, Value] = {}  # modules traced as FORMAT -> the rendered prompt
    opaque: list[str] = []
    for m in topo:
        static: dict[str, Value] | None = None  # the module's keys, when they are known before it runs
        with b.module(m):
            if m in roots:
                kwargs = b.call(_root_input(m), {"inputs": inputs}, name="inputs", inline=True)
            else:
                ports: dict[str, Value] = {"ctx": ctx}
                for i, link in enumerate(links[m]):
                    plain = link.condition_fn is None and link.input_fn is None
                    ports[f"l{i}"] = b.call(
                        _deliver(link), {"output": outs[link.src]}, name=f"link_from_{link.src}", inline=plain
                    )
                kwargs = b.call(_assemble(links[m]), ports, name="inputs", inline=True)
                if all(link.required for link in links[m]):
                    static = {link.dest_key: ports[f"l{i}"] for i, link in enumerate(links[m])}
            ins[m] = kwargs
            direct = _direct_prompt(modules[m], links[m], static, formats)
            outs[m] = _trace_module(
                b, engines, m, modules[m], kwargs, ctx, m in skippable, opaque, warn, static, direct, formats
            )
    collected = {f"o{i}": outs[m] for i, m in enumerate(topo)} | {f"i{i}": ins[m] for i, m in enumerate(topo)}
    result = b.call(_collect(topo), collected, name="collect", inline=True)
    b.output(result=result)
    graph = b.build(chain_modules=False)
    return PipelinePlan(graph, graph, waves, index, leaves, opaque)


def _trace_module(
    b: GraphBuilder,
    engines: EngineRegistry,
    key: str,
    component: QueryComponent,
    kwargs: Value,
    ctx: Value,
    skippable: bool,
    opaque: list[str],
    warn: bool,
    static: dict[str, Value] | None,
    direct: Value | None,
    formats: dict[str, Value],
) -> Value:
    """The module's output dict (see the module docstring for what each class becomes).

    `static`: the values of the module's input keys by key when every link is required
    (so the key set is fixed); a prompt then formats each variable as soon as its own
    link delivers, which lets prefill split prefill a ready prefix early. `direct`: the
    FORMAT output an LLM's prompt provably equals (see `_direct_prompt`); `formats`
    records this module's FORMAT output for the modules after it.
    """
    if not skippable:
        if isinstance(component, LLMCompleteComponent) and not component.streaming:
            if direct is not None:
                prompt = direct
            else:
                validated = b.call(_validate(component), {"kwargs": kwargs}, name="validate", inline=True)
                prompt = b.call(_pick("prompt"), {"validated": validated}, name="prompt", inline=True)
            out = b.llm(prompt, engine=engines.llm(component.llm), max_tokens=max_tokens_hint(component.llm))
            return b.call(_finish(component, "output"), {"value": out.text}, name="outputs", inline=True)
        if isinstance(component, PromptComponent) and (template := _formattable(component)) is not None:
            variables = list(template.variables)
            keys = set(static or ()) | set(component.partial_dict)
            if static is not None and keys == set(component.input_keys.required_keys):
                values = {
                    v: b.call(
                        _stringable(v, component.partial_dict),
                        {"value": static.get(v, ctx)},
                        name=f"var_{v}",
                        inline=True,
                    )
                    for v in variables
                }
                prompt = formats[key] = b.format(template, **values)
                return b.call(_finish(component, "prompt"), {"value": prompt}, name="outputs", inline=True)
            validated = b.call(_validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            if len(variables) == 1:  # a one-output call's value is the function's return value
                values = {variables[0]: b.call(_pick(variables[0]), {"validated": validated}, name="vars", inline=True)}
            else:
                first = b.call(_split(variables), {"validated": validated}, outputs=variables, name="vars", inline=True)
                values = {v: b.call_outputs(first, v) for v in variables}
            prompt = formats[key] = b.format(template, **values)
            return b.call(_finish(component, "prompt"), {"value": prompt}, name="outputs", inline=True)
        if isinstance(component, PostprocessorComponent) and reranks(component.postprocessor):
            validated = b.call(_validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            nodes = b.call(_pick("nodes"), {"validated": validated}, name="nodes", inline=True)
            query = b.call(_pick_optional("query_str"), {"validated": validated}, name="query", inline=True)
            engine = engines.reranker(component.postprocessor)
            reranked = trace_rerank(b, engine, component.postprocessor, query, nodes, ctx, call="query_str")
            return b.call(_finish(component, "nodes"), {"value": reranked}, name="outputs", inline=True)
        if isinstance(component, SynthesizerComponent) and why_opaque(component.synthesizer) is None:
            synthesizer = component.synthesizer
            validated = b.call(_validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            nodes = b.call(_pick("nodes"), {"validated": validated}, name="nodes", inline=True)
            partials = component.partial_dict
            if static is not None and ("query_str" in static or "query_str" in partials):
                early = static.get("query_str", ctx)  # partials win, as the merge does
                query = b.call(_stringable("query_str", partials), {"value": early}, name="query", inline=True)
            else:
                query = b.call(_pick("query_str"), {"validated": validated}, name="query", inline=True)
            response = trace_synthesis(
                b,
                engines,
                synthesizer,
                query,
                nodes,
                lambda: b.call(_synthesize(synthesizer), {"validated": validated, "ctx": ctx}, name="run"),
            )
            return b.call(_finish(component, "output"), {"value": response}, name="outputs", inline=True)
        if isinstance(component, RetrieverComponent) and traceable(component.retriever):
            validated = b.call(_validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            query = b.call(_pick("input"), {"validated": validated}, name="query", inline=True)
            nodes = trace_retriever(b, engines, component.retriever, query, ctx)
            return b.call(_finish(component, "output"), {"value": nodes}, name="outputs", inline=True)
    if isinstance(component, _INLINE):
        return b.call(_run_inline(component), {"kwargs": kwargs}, name="run", inline=True)
    if not isinstance(component, _KNOWN):
        opaque.append(f"{key} ({type(component).__name__})")
        if warn:
            warnings.warn(
                f"teola: QueryPipeline module {key!r} ({type(component).__name__}) runs as one opaque call",
                OpaqueModuleWarning,
                stacklevel=4,
            )
    return b.call(_run_module(component), {"kwargs": kwargs, "ctx": ctx}, name="run")


def _direct_prompt(
    component: QueryComponent, links: list[_Link], static: dict[str, Value] | None, formats: dict[str, Value]
) -> Value | None:
    """The FORMAT output an LLM module's validated prompt equals, if provably so.

    So when the LLM's only input is a plain link from a prompt traced as FORMAT (a str),
    the key set is {"prompt"} (validation passes) and the LLM's `completion_to_prompt` is
    LlamaIndex's identity default: `validate_and_convert_stringable(str)` is the str.
    """
    if not isinstance(component, LLMCompleteComponent) or static is None or component.partial_dict:
        return None
    if set(static) != {"prompt"} or component.llm.completion_to_prompt is not default_completion_to_prompt:
        return None
    (link,) = links
    plain = link.condition_fn is None and link.input_fn is None and link.src_key in (None, "prompt")
    return formats.get(link.src) if plain else None


def _formattable(component: PromptComponent) -> Any:
    """The segment template of a plain `PromptTemplate`, or None where formatting does more."""
    prompt = component.prompt
    if type(prompt) is not PromptTemplate or component.format_messages or component.llm is not None:
        return None
    if prompt.kwargs or prompt.output_parser is not None or prompt.template_var_mappings or prompt.function_mappings:
        return None
    return segments_of(prompt.template, component.input_keys.required_keys)


# -- the functions behind the call nodes -------------------------------------------------
def _root_input(key: str) -> Callable[..., Any]:
    def root(inputs: Mapping[str, Any]) -> Any:
        return inputs[key]

    return root


def _deliver(link: _Link) -> Callable[..., Any]:
    """What `process_component_output` hands on along one link (or SKIPPED)."""

    def deliver(output: Any) -> Any:
        if output is SKIPPED:
            return SKIPPED
        value = get_output(link.src_key, output)
        delivered = link.input_fn(value) if link.input_fn is not None else value
        if link.condition_fn is None or link.condition_fn(value):
            return delivered
        return SKIPPED

    return deliver


def _assemble(links: list[_Link]) -> Callable[..., Any]:
    """The module's input dict in arrival order, or SKIPPED if a required key never came."""

    def assemble(ctx: QueryContext, **values: Any) -> Any:
        kwargs: dict[str, Any] = {}
        for i, link in enumerate(links):
            value = values[f"l{i}"]
            if value is SKIPPED:
                if link.required:
                    return SKIPPED
                continue
            kwargs[link.dest_key] = value
        return kwargs

    return assemble


def _validate(component: QueryComponent) -> Callable[..., dict[str, Any]]:
    """`run_component`'s first half: partials, then the component's own input validation."""

    def validate(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(kwargs)
        merged.update(component.partial_dict)
        return component.validate_component_inputs(merged)

    return validate


def _pick(key: str) -> Callable[..., Any]:
    def pick(validated: Mapping[str, Any]) -> Any:
        return validated[key]

    return pick


def _pick_optional(key: str) -> Callable[..., Any]:
    def pick(validated: Mapping[str, Any]) -> Any:
        return validated.get(key)

    return pick


def _synthesize(synthesizer: Any) -> Callable[..., Any]:
    """`SynthesizerComponent`'s run after validation: the whole synthesizer, sync or async."""

    async def run(validated: Mapping[str, Any], ctx: QueryContext) -> Any:
        query_str, nodes = validated["query_str"], validated["nodes"]
        if ctx.sync:
            return await asyncio.to_thread(synthesizer.synthesize, query_str, nodes)
        return await synthesizer.asynthesize(query_str, nodes)

    return run


def _stringable(key: str, partials: Mapping[str, Any]) -> Callable[..., Any]:
    """One variable of `PromptComponent._validate_component_inputs` (partials win, as merged)."""

    def stringable(value: Any) -> Any:
        return validate_and_convert_stringable(partials.get(key, value))

    return stringable


def _split(variables: list[str]) -> Callable[..., dict[str, Any]]:
    def split(validated: Mapping[str, Any]) -> dict[str, Any]:
        return {v: validated[v] for v in variables}

    return split


def _finish(component: QueryComponent, key: str) -> Callable[..., dict[str, Any]]:
    """`run_component`'s last step: the component's own output validation."""

    def finish(value: Any) -> dict[str, Any]:
        return component.validate_component_outputs({key: value})

    return finish


def _run_inline(component: QueryComponent) -> Callable[..., Any]:
    def run(kwargs: Any) -> Any:
        return SKIPPED if kwargs is SKIPPED else component.run_component(**kwargs)

    return run


def _run_module(component: QueryComponent) -> Callable[..., Any]:
    """The whole component: its sync API in a worker thread for sync calls, else async."""

    async def run(kwargs: Any, ctx: QueryContext) -> Any:
        if kwargs is SKIPPED:
            return SKIPPED
        if ctx.sync:
            return await asyncio.to_thread(component.run_component, **kwargs)
        return await component.arun_component(**kwargs)

    return run


def _collect(order: list[str]) -> Callable[..., dict[str, dict[str, Any]]]:
    """The outputs and input dicts of the modules that ran."""

    def collect(**values: Any) -> dict[str, dict[str, Any]]:
        outs, ins = {}, {}
        for i, m in enumerate(order):
            if values[f"o{i}"] is not SKIPPED:
                outs[m] = values[f"o{i}"]
                ins[m] = values[f"i{i}"]
        return {"outs": outs, "ins": ins}

    return collect


# -- the executor ------------------------------------------------------------------------
class TeolaQueryPipelineExecutor:
    """Runs a `QueryPipeline` on Teola with the pipeline's own call surface.

    Options: backend ("local", scheduled and batching, or "reference"), policy (the
    local runtime's engine scheduling policy), passes (True, False or a `PassManager`),
    profiles (latency profiles by engine name, e.g. "llm:MockLLM", see `explain()`, so
    the passes can plan; the user's components have none), warn (warn once for each
    opaque module), warm_prefix (warm a split prompt's ready prefix on the server of an
    `OpenAILike`/`OpenAI` completion model, see `openai_compat`). Sync methods run on an event loop this
    object owns in a daemon thread (`close()` stops it); async methods on the caller's.
    """

    def __init__(
        self,
        pipeline: QueryPipeline,
        *,
        backend: str = DEFAULT_BACKEND,
        policy: str = "topology",
        passes: Any = True,
        profiles: Mapping[str, LatencyProfile] | None = None,
        warn: bool = True,
        warm_prefix: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.original = pipeline
        self.backend = backend
        self.policy = policy
        self._engines = EngineRegistry(warm_prefix=warm_prefix)
        self.plan: PipelinePlan | None = None
        self.fallback: str | None = None
        try:
            self.plan = trace_pipeline(pipeline, self._engines, warn=warn)
        except UnsupportedPipeline as exc:
            self.fallback = str(exc)
            warnings.warn(
                f"teola: this QueryPipeline runs on its own executor ({exc})", OpaqueModuleWarning, stacklevel=2
            )
        if self.plan is not None:
            self.plan.graph, self.plan.passes = optimize_graph(
                self.plan.pgraph, passes, self._engines.engines, profiles
            )
        self._runtimes = RuntimePerLoop(self._engines.engines, backend, policy)
        self._thread = LoopThread("teola:QueryPipeline")
        self._finalizer = weakref.finalize(self, self._thread.close)

    def explain(self) -> str:
        """What was traced into what (p-graph, passes, e-graph), or why the original runs."""
        if self.plan is None:
            return f"original QueryPipeline executor: {self.fallback}"
        lines = ["opaque modules: " + (", ".join(self.plan.opaque) or "none")]
        lines += ["engines: " + (", ".join(self._engines.engines.engines) or "none")]
        lines += warmup_notes(self._engines.engines)
        lines += ["passes: " + (", ".join(self.plan.passes) or "none")]
        lines += ["p-graph:", self.plan.pgraph.summary(), "e-graph:", self.plan.graph.summary()]
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the event-loop thread of the sync methods (it restarts if used again)."""
        self._thread.close()

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The names of the engines the traced object runs on."""
        return self._runtimes.engine_names

    def runtime_for_current_loop(self) -> Any:
        """The runtime serving async calls on the running event loop (one per loop)."""
        return self._runtime()

    # -- running -----------------------------------------------------------------------
    def _runtime(self) -> Any:
        return self._runtimes.current()

    async def _one(self, module_inputs: dict[str, Any], sync: bool) -> tuple[dict[str, Any], Any]:
        assert self.plan is not None
        self.original._validate_inputs(module_inputs)
        try:
            out = await self._runtime().run(self.plan.graph, {"inputs": module_inputs, "context": QueryContext(sync)})
        except PrimitiveError as exc:
            error = unwrap_error(exc, {n.id: n.module or "" for n in self.plan.graph.nodes.values()})
        else:
            collected = out["result"]
            return self.plan.compose(collected["outs"], collected["ins"], sync=sync)
        raise error

    async def _many(self, inputs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
        results = await asyncio.gather(*(self._one(i, sync=False) for i in inputs), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)  # type: ignore[arg-type]

    async def _single(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], direct: bool, batch: bool, sync: bool
    ) -> Any:
        root, kw = self.original._get_root_key_and_kwargs(*args, **kwargs)
        if batch:
            if len({len(value) for value in kw.values()}) != 1:
                raise ValueError("Length of batch inputs must be the same.")
            kwargs_list = [dict(zip(kw.keys(), values, strict=True)) for values in zip(*kw.values(), strict=True)]
            results = await self._many([{root: k} for k in kwargs_list])
            return [self.original._get_single_result_output(r, direct) for r, _ in results], [i for _, i in results]
        result, intermediates = await self._one({root: kw}, sync)
        return self.original._get_single_result_output(result, direct), intermediates

    async def _multi(self, module_inputs: dict[str, Any], batch: bool, sync: bool) -> Any:
        if not batch:
            return await self._one(module_inputs, sync)
        lengths = {len(values) for sub in module_inputs.values() for values in sub.values()}
        if len(lengths) != 1:
            raise ValueError("Length of batch inputs must be the same.")
        inputs = [
            {key: {k: v[i] for k, v in value.items()} for key, value in module_inputs.items()}
            for i in range(next(iter(lengths)))
        ]
        outputs: dict[str, Any] = {}
        for result, _ in await self._many(inputs):
            outputs = self.original.merge_dicts(outputs, result)
        return outputs, None

    def _sync(self, coro: Any) -> Any:
        return self._thread.run(coro)

    def run(
        self,
        *args: Any,
        return_values_direct: bool = True,
        callback_manager: Any = None,
        batch: bool = False,
        **kwargs: Any,
    ) -> Any:
        if self.plan is None or callback_manager is not None:
            return self.original.run(
                *args,
                return_values_direct=return_values_direct,
                callback_manager=callback_manager,
                batch=batch,
                **kwargs,
            )
        return self._sync(self._single(args, kwargs, return_values_direct, batch, sync=not batch))[0]

    async def arun(
        self,
        *args: Any,
        return_values_direct: bool = True,
        callback_manager: Any = None,
        batch: bool = False,
        **kwargs: Any,
    ) -> Any:
        if self.plan is None or callback_manager is not None:
            return await self.original.arun(
                *args,
                return_values_direct=return_values_direct,
                callback_manager=callback_manager,
                batch=batch,
                **kwargs,
            )
        return (await self._single(args, kwargs, return_values_direct, batch, sync=False))[0]

    def run_with_intermediates(
        self,
        *args: Any,
        return_values_direct: bool = True,
        callback_manager: Any = None,
        batch: bool | None = None,
        **kwargs: Any,
    ) -> tuple[Any, dict[str, ComponentIntermediates]]:
        if batch is not None:
            raise ValueError("Batch is not supported for run_with_intermediates.")
        if self.plan is None or callback_manager is not None:
            return self.original.run_with_intermediates(
                *args, return_values_direct=return_values_direct, callback_manager=callback_manager, **kwargs
            )
        return self._sync(self._single(args, kwargs, return_values_direct, False, sync=True))

    async def arun_with_intermediates(
        self,
        *args: Any,
        return_values_direct: bool = True,
        callback_manager: Any = None,
        batch: bool | None = None,
        **kwargs: Any,
    ) -> tuple[Any, dict[str, ComponentIntermediates]]:
        if batch is not None:
            raise ValueError("Batch is not supported for run_with_intermediates.")
        if self.plan is None or callback_manager is not None:
            return await self.original.arun_with_intermediates(
                *args, return_values_direct=return_values_direct, callback_manager=callback_manager, **kwargs
            )
        return await self._single(args, kwargs, return_values_direct, False, sync=False)

    def run_multi(self, module_input_dict: dict[str, Any], callback_manager: Any = None, batch: bool = False) -> Any:
        if self.plan is None or callback_manager is not None:
            return self.original.run_multi(module_input_dict, callback_manager=callback_manager, batch=batch)
        return self._sync(self._multi(module_input_dict, batch, sync=not batch))[0]

    async def arun_multi(
        self, module_input_dict: dict[str, Any], callback_manager: Any = None, batch: bool = False
    ) -> Any:
        if self.plan is None or callback_manager is not None:
            return await self.original.arun_multi(module_input_dict, callback_manager=callback_manager, batch=batch)
        return (await self._multi(module_input_dict, batch, sync=False))[0]

    def run_multi_with_intermediates(
        self, module_input_dict: dict[str, Any], callback_manager: Any = None
    ) -> tuple[dict[str, Any], dict[str, ComponentIntermediates]]:
        if self.plan is None or callback_manager is not None:
            return self.original.run_multi_with_intermediates(module_input_dict, callback_manager=callback_manager)
        return self._sync(self._multi(module_input_dict, False, sync=True))

    async def arun_multi_with_intermediates(
        self, module_input_dict: dict[str, Any], callback_manager: Any = None
    ) -> Any:
        """Returns the outputs only, as LlamaIndex's own `arun_multi_with_intermediates` does."""
        if self.plan is None or callback_manager is not None:
            return await self.original.arun_multi_with_intermediates(
                module_input_dict, callback_manager=callback_manager
            )
        return (await self._multi(module_input_dict, False, sync=False))[0]
