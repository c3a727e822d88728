"""The functions behind a traced QueryPipeline's call nodes: QueryPipeline's own rules, step by step.

    deliver = deliver(link)         # one DAG edge: get_output, input_fn, condition_fn (or SKIPPED)
    kwargs = assemble(links)(ctx, l0=..., l1=...)   # a module's input dict, in arrival order
    await run_module(component)(kwargs, ctx)        # component.run_component / arun_component

Each mirrors one piece of `QueryPipeline._run_multi` / `run_component`; modules that call
into the framework do it through the query's context (`scope`), so their spans, events
and callbacks are LlamaIndex's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.query_pipeline.query import QueryComponent, validate_and_convert_stringable
from llama_index.core.query_pipeline.query import get_output, print_debug_input

from teola_llamaindex.common import SKIPPED
from teola_llamaindex.executor_spans import WaveSpans
from teola_llamaindex.scope import QueryContext


@dataclass(frozen=True)
class Link:
    """One DAG edge into a module, resolved (see `pipeline_trace`)."""

    src: str
    dest: str
    src_key: str | None
    dest_key: str
    required: bool
    condition_fn: Callable[[Any], Any] | None
    input_fn: Callable[[Any], Any] | None
    order: tuple[int, int, int]  # arrival order: (wave of src, module index of src, edge index)


def root_input(key: str) -> Callable[..., Any]:
    def root(inputs: Mapping[str, Any]) -> Any:
        return inputs[key]

    return root


def deliver(link: Link) -> Callable[..., Any]:
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


def assemble(links: list[Link]) -> Callable[..., Any]:
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


def validate(component: QueryComponent) -> Callable[..., dict[str, Any]]:
    """`run_component`'s first half: partials, then the component's own input validation."""

    def validate(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(kwargs)
        merged.update(component.partial_dict)
        return component.validate_component_inputs(merged)

    return validate


def pick(key: str) -> Callable[..., Any]:
    def pick(validated: Mapping[str, Any]) -> Any:
        return validated[key]

    return pick


def pick_optional(key: str) -> Callable[..., Any]:
    def pick(validated: Mapping[str, Any]) -> Any:
        return validated.get(key)

    return pick


def synthesize(synthesizer: Any) -> Callable[..., Any]:
    """`SynthesizerComponent`'s run after validation: the whole synthesizer, sync or async."""

    async def run(validated: Mapping[str, Any], ctx: QueryContext) -> Any:
        query_str, nodes = validated["query_str"], validated["nodes"]
        return await ctx.call(synthesizer.synthesize, synthesizer.asynthesize, query_str, nodes)

    return run


def stringable(key: str, partials: Mapping[str, Any]) -> Callable[..., Any]:
    """One variable of `PromptComponent._validate_component_inputs` (partials win, as merged)."""

    def stringable(value: Any) -> Any:
        return validate_and_convert_stringable(partials.get(key, value))

    return stringable


def split(variables: list[str]) -> Callable[..., dict[str, Any]]:
    def split(validated: Mapping[str, Any]) -> dict[str, Any]:
        return {v: validated[v] for v in variables}

    return split


def finish(component: QueryComponent, key: str) -> Callable[..., dict[str, Any]]:
    """`run_component`'s last step: the component's own output validation."""

    def finish(value: Any) -> dict[str, Any]:
        return component.validate_component_outputs({key: value})

    return finish


def run_inline(component: QueryComponent) -> Callable[..., Any]:
    def run(kwargs: Any) -> Any:
        return SKIPPED if kwargs is SKIPPED else component.run_component(**kwargs)

    return run


def run_module(component: QueryComponent) -> Callable[..., Any]:
    """The whole component: `run_component` for sync calls (on the caller's thread), else `arun_component`."""

    async def run(kwargs: Any, ctx: QueryContext, warm: Any = None) -> Any:
        if kwargs is SKIPPED:
            return SKIPPED
        return await ctx.call(component.run_component, component.arun_component, **kwargs)

    return run


def collect(order: list[str]) -> Callable[..., dict[str, dict[str, Any]]]:
    """The outputs and input dicts of the modules that ran."""

    def collect(**values: Any) -> dict[str, dict[str, Any]]:
        outs, ins = {}, {}
        for i, m in enumerate(order):
            if values[f"o{i}"] is not SKIPPED:
                outs[m] = values[f"o{i}"]
                ins[m] = values[f"i{i}"]
        return {"outs": outs, "ins": ins}

    return collect


def announce(key: str) -> Callable[..., Any]:
    """A verbose pipeline's `print_debug_input` before the module runs (nothing if it is skipped)."""

    def show(kwargs: Any) -> Any:
        if kwargs is not SKIPPED:
            print_debug_input(key, kwargs)
        return kwargs

    return show


def begin(key: str) -> Callable[..., QueryContext]:
    """The context the module runs in: in an async run, its own `worker` span (`executor_spans`)."""

    def begin(kwargs: Any, ctx: QueryContext, spans: WaveSpans | None) -> QueryContext:
        if spans is None or kwargs is SKIPPED:
            return ctx
        return ctx.in_module(key, spans.begin(key))

    return begin


def end(key: str) -> Callable[..., Any]:
    """The module's output, once its `worker` span (if any) is closed."""

    def end(output: Any, spans: WaveSpans | None) -> Any:
        if spans is not None:
            spans.end(key, None if output is SKIPPED else output)
        return output

    return end
