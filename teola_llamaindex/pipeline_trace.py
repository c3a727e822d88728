"""Trace a `QueryPipeline` (llama-index-core <= 0.12) into a Teola graph that computes what its executor does.

    plan = trace_pipeline(pipeline, EngineRegistry())     # raises UnsupportedPipeline
    plan.graph.summary()                                  # FORMAT, PREFILL/DECODE, SEARCH, RERANK, calls

A module runs once its required keys have arrived, in the wave QueryPipeline's loop would
run it; each link is `get_output`, `input_fn`, `condition_fn` (a failed condition skips
the modules behind it); prompts become FORMAT, LLM completions PREFILL + DECODE on the
user's LLM, retrievers a SEARCH on their own engine, rerankers RERANK, every other module
one call of its own `run_component` / `arun_component`. The rules, and the shapes that
stay on LlamaIndex's executor: docs/llamaindex.md ("QueryPipeline").
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from llama_index.core.base.base_retriever import RetrieverComponent
from llama_index.core.base.query_pipeline.query import ComponentIntermediates, QueryComponent
from llama_index.core.llms.llm import LLMCompleteComponent, default_completion_to_prompt
from llama_index.core.postprocessor.types import PostprocessorComponent
from llama_index.core.prompts.base import PromptComponent, PromptTemplate
from llama_index.core.query_pipeline import QueryPipeline
from llama_index.core.query_pipeline.components.argpacks import ArgPackComponent, KwargPackComponent
from llama_index.core.query_pipeline.components.input import InputComponent
from llama_index.core.response_synthesizers.base import SynthesizerComponent

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.graph import Graph
from teola_llamaindex.common import OpaqueModuleWarning
from teola_llamaindex.formatting import segments_of
from teola_llamaindex.pipeline_steps import (
    Link,
    announce,
    assemble,
    begin,
    collect,
    deliver,
    end,
    finish,
    pick,
    pick_optional,
    root_input,
    run_inline,
    run_module,
    split,
    stringable,
    synthesize,
    validate,
)
from teola_llamaindex.registry import EngineRegistry
from teola_llamaindex.rerank import reranks, trace_rerank
from teola_llamaindex.retrievers import trace_retriever
from teola_llamaindex.synthesis import max_tokens_hint, trace_synthesis, trace_warmup, warmup_prefix, why_opaque

# Components whose run is cheap and pure: run inline, the same for sync and async calls.
_INLINE = (InputComponent, ArgPackComponent, KwargPackComponent)
# Known components run as one call without a warning (they do their own engine calls).
_KNOWN = (*_INLINE, PostprocessorComponent, SynthesizerComponent, QueryPipeline, LLMCompleteComponent)


class UnsupportedPipeline(Exception):
    """The pipeline's semantics cannot be reproduced as a graph; the original executor runs it."""


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


def trace_pipeline(
    pipeline: QueryPipeline, engines: EngineRegistry, *, warn: bool = True, decompose: bool | None = None
) -> PipelinePlan:
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
    links: dict[str, list[Link]] = {}
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
                Link(
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
    spans = b.input("spans")  # the async executor's spans (`executor_spans`), None in sync runs
    outs: dict[str, Value] = {}
    ins: dict[str, Value] = {}
    tracer = _Tracer(b, engines, ctx, warn, decompose)
    for m in topo:
        static: dict[str, Value] | None = None  # the module's keys, when they are known before it runs
        with b.module(m):
            if m in roots:
                kwargs = b.call(root_input(m), {"inputs": inputs}, name="inputs", inline=True)
            else:
                ports: dict[str, Value] = {"ctx": ctx}
                for i, link in enumerate(links[m]):
                    plain = link.condition_fn is None and link.input_fn is None
                    ports[f"l{i}"] = b.call(
                        deliver(link), {"output": outs[link.src]}, name=f"link_from_{link.src}", inline=plain
                    )
                kwargs = b.call(assemble(links[m]), ports, name="inputs", inline=True)
                if all(link.required for link in links[m]):
                    static = {link.dest_key: ports[f"l{i}"] for i, link in enumerate(links[m])}
            if pipeline.verbose:
                kwargs = b.call(announce(m), {"kwargs": kwargs}, name="announce", inline=True)
            ins[m] = kwargs
            direct = _direct_prompt(modules[m], links[m], static, tracer.formats)
            module_ctx = b.call(begin(m), {"kwargs": kwargs, "ctx": ctx, "spans": spans}, name="begin", inline=True)
            out = tracer.module(m, modules[m], kwargs, module_ctx, m in skippable, static, direct)
            outs[m] = b.call(end(m), {"output": out, "spans": spans}, name="end", inline=True)
    collected = {f"o{i}": outs[m] for i, m in enumerate(topo)} | {f"i{i}": ins[m] for i, m in enumerate(topo)}
    result = b.call(collect(topo), collected, name="collect", inline=True)
    b.output(result=result)
    graph = b.build(chain_modules=False)
    return PipelinePlan(graph, graph, waves, index, leaves, tracer.opaque)


@dataclass
class _Tracer:
    """What tracing one pipeline's modules shares."""

    b: GraphBuilder
    engines: EngineRegistry
    ctx: Value
    warn: bool
    decompose: bool | None
    opaque: list[str] = field(default_factory=list)
    formats: dict[str, Value] = field(default_factory=dict)  # modules traced as FORMAT -> the prompt

    def module(
        self,
        key: str,
        component: QueryComponent,
        kwargs: Value,
        ctx: Value,
        skippable: bool,
        static: dict[str, Value] | None,
        direct: Value | None,
    ) -> Value:
        """The module's output dict (see the module docstring for what each class becomes).

        `static`: the values of the module's input keys by key when every link is required
        (so the key set is fixed); a prompt then formats each variable as soon as its own
        link delivers, which lets prefill split prefill a ready prefix early. `direct`: the
        FORMAT output an LLM's prompt provably equals (see `_direct_prompt`). `ctx`: the
        module's context (`pipeline_steps.begin`), which its framework calls run in.
        """
        b = self.b
        if skippable:
            return self._whole(key, component, kwargs, ctx)
        if isinstance(component, LLMCompleteComponent) and not component.streaming:
            if direct is not None:
                prompt = direct
            else:
                validated = b.call(validate(component), {"kwargs": kwargs}, name="validate", inline=True)
                prompt = b.call(pick("prompt"), {"validated": validated}, name="prompt", inline=True)
            out = b.llm(prompt, engine=self.engines.llm(component.llm), max_tokens=max_tokens_hint(component.llm))
            b.after(ctx, out.text)  # the model call runs in the module's context
            return b.call(finish(component, "output"), {"value": out.text}, name="outputs", inline=True)
        if isinstance(component, PromptComponent) and (template := _formattable(component)) is not None:
            return self._prompt(key, component, template, kwargs, static)
        if isinstance(component, PostprocessorComponent) and reranks(component.postprocessor):
            validated = b.call(validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            nodes = b.call(pick("nodes"), {"validated": validated}, name="nodes", inline=True)
            query = b.call(pick_optional("query_str"), {"validated": validated}, name="query", inline=True)
            engine = self.engines.reranker(component.postprocessor)
            reranked = trace_rerank(b, engine, component.postprocessor, query, nodes, ctx, call="query_str")
            return b.call(finish(component, "nodes"), {"value": reranked}, name="outputs", inline=True)
        if isinstance(component, SynthesizerComponent):
            return self._synthesizer(key, component, kwargs, ctx, static)
        if isinstance(component, RetrieverComponent):
            validated = b.call(validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            query = b.call(pick("input"), {"validated": validated}, name="query", inline=True)
            nodes = trace_retriever(b, self.engines, component.retriever, query, ctx, decompose=self.decompose)
            return b.call(finish(component, "output"), {"value": nodes}, name="outputs", inline=True)
        return self._whole(key, component, kwargs, ctx)

    def _whole(
        self, key: str, component: QueryComponent, kwargs: Value, ctx: Value, warm: Value | None = None
    ) -> Value:
        """The module as one call of its own `run_component` (inline for the pure ones)."""
        if isinstance(component, _INLINE):
            return self.b.call(run_inline(component), {"kwargs": kwargs}, name="run", inline=True)
        if not isinstance(component, _KNOWN):
            self.opaque.append(f"{key} ({type(component).__name__})")
            if self.warn:
                warnings.warn(
                    f"teola: QueryPipeline module {key!r} ({type(component).__name__}) runs as one opaque call",
                    OpaqueModuleWarning,
                    stacklevel=5,
                )
        inputs = {"kwargs": kwargs, "ctx": ctx} | ({} if warm is None else {"warm": warm})
        return self.b.call(run_module(component), inputs, name="run")

    def _prompt(
        self, key: str, component: PromptComponent, template: Any, kwargs: Value, static: dict[str, Value] | None
    ) -> Value:
        b = self.b
        variables = list(template.variables)
        keys = set(static or ()) | set(component.partial_dict)
        if static is not None and keys == set(component.input_keys.required_keys):
            values = {
                v: b.call(
                    stringable(v, component.partial_dict),
                    {"value": static.get(v, self.ctx)},
                    name=f"var_{v}",
                    inline=True,
                )
                for v in variables
            }
        else:
            validated = b.call(validate(component), {"kwargs": kwargs}, name="validate", inline=True)
            if len(variables) == 1:  # a one-output call's value is the function's return value
                values = {variables[0]: b.call(pick(variables[0]), {"validated": validated}, name="vars", inline=True)}
            else:
                first = b.call(split(variables), {"validated": validated}, outputs=variables, name="vars", inline=True)
                values = {v: b.call_outputs(first, v) for v in variables}
        prompt = self.formats[key] = b.format(template, **values)
        return b.call(finish(component, "prompt"), {"value": prompt}, name="outputs", inline=True)

    def _synthesizer(
        self, key: str, component: SynthesizerComponent, kwargs: Value, ctx: Value, static: dict[str, Value] | None
    ) -> Value:
        """A prefix warm-up beside the whole synthesizer, or (decompose) plan + FORMAT + LLM."""
        b, synthesizer = self.b, component.synthesizer
        decomposed = bool(self.decompose) and why_opaque(synthesizer) is None
        prefix = None if decomposed else warmup_prefix(self.engines, synthesizer)
        if not decomposed and prefix is None:
            return self._whole(key, component, kwargs, ctx)
        validated = b.call(validate(component), {"kwargs": kwargs}, name="validate", inline=True)
        partials = component.partial_dict
        if static is not None and ("query_str" in static or "query_str" in partials):
            early = static.get("query_str", self.ctx)  # partials win, as the merge does
            query = b.call(stringable("query_str", partials), {"value": early}, name="query", inline=True)
        else:
            query = b.call(pick("query_str"), {"validated": validated}, name="query", inline=True)
        if prefix is not None:
            return self._whole(key, component, kwargs, ctx, trace_warmup(b, self.engines, synthesizer, prefix, query))
        nodes = b.call(pick("nodes"), {"validated": validated}, name="nodes", inline=True)
        response = trace_synthesis(
            b,
            self.engines,
            synthesizer,
            query,
            nodes,
            lambda: b.call(synthesize(synthesizer), {"validated": validated, "ctx": ctx}, name="run"),
        )
        return b.call(finish(component, "output"), {"value": response}, name="outputs", inline=True)


def _direct_prompt(
    component: QueryComponent, links: list[Link], static: dict[str, Value] | None, formats: dict[str, Value]
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
