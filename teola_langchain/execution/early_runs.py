"""The functions behind a step that starts early (`tracing/early_steps.py`): its projection, its early
run, and the moment the chain reaches it.

    project(("text",))(k0="...")           -> {"text": "..."}        the keys the step reads
    start_early(sub)(value=projection)      -> EarlyOutcome            its run, callbacks recorded
    reach(sub, ref, scope)(outcome, value)  -> the step's output       recording handed on, in order
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.globals import get_debug

from teola_langchain.execution import runs, steps
from teola_langchain.execution.context import EarlyRun, OpenRun, QueryContext, StepRef
from teola_langchain.execution.deferred_callbacks import with_handlers
from teola_langchain.tracing.traced import SubGraph
from teola_langchain.tracing.values import MISSING


@dataclass
class EarlyOutcome:
    """What a step's early run left for the moment the chain reaches it.

    early: its recording and projection (None: it did not run early, so it runs in order);
    value or error: how it ended; open: the runs it left open (an `.assign`'s own, for the merge).
    """

    early: EarlyRun | None
    value: Any = None
    error: Exception | None = None
    open: Mapping[str, OpenRun] = field(default_factory=dict)


def project(keys: tuple[str, ...]) -> Any:
    """The dict of the keys a step reads (ports k0, k1, ...), keys absent at run time left out."""

    def run(**values: Any) -> dict[str, Any]:
        got = (values[f"k{i}"] for i in range(len(keys)))
        return {key: value for key, value in zip(keys, got, strict=True) if value is not MISSING}

    return run


def start_early(sub: SubGraph) -> steps.Step:
    """Run the step's graph on its projection now, its callbacks recorded (an error is kept, not raised)."""

    async def run(value: Any, ctx: QueryContext) -> EarlyOutcome:
        if get_debug():  # LangChain's debug printing would show the early run at once
            return EarlyOutcome(None)
        early = ctx.running_early(value)
        try:
            output = await steps.run_graph(sub, value, early)
        except Exception as error:  # kept for the moment the chain reaches the step
            return EarlyOutcome(early.early, error=error)
        return EarlyOutcome(early.early, value=output, open=dict(early.own_runs()))

    return run


def reach(sub: SubGraph, ref: StepRef, scope: str | None) -> steps.Step:
    """The chain reached the step (`value`: its real input): hand its recorded callbacks on and
    return its output or raise its error; `scope`: an `.assign`'s run, ended here with the merge."""

    async def run(outcome: EarlyOutcome, value: Any, ctx: QueryContext) -> Any:
        early = outcome.early
        if early is None or early.read_failed:
            return await _in_order(sub, scope, value, ctx)
        live = ctx.step_config(ref).get("callbacks")
        if not isinstance(live, BaseCallbackManager):
            raise TypeError(f"teola: expected a callback manager for {ref}, got {live!r}; please report this chain")
        await runs.hand_on(ctx, early.recorder, live.handlers, {id(early.projection): value})
        if outcome.error is not None:
            raise outcome.error
        if scope is None:
            return outcome.value
        merged = {**value, **outcome.value}
        await runs.call_manager(ctx, with_handlers(outcome.open[scope].manager, live).on_chain_end, merged)
        return merged

    return run


async def _in_order(sub: SubGraph, scope: str | None, value: Any, ctx: QueryContext) -> Any:
    """The step run now, on its real input, as if it had never started early."""
    child = ctx.child()
    output = await steps.run_graph(sub, value, child)
    if scope is None:
        return output
    return await runs.close_run(child, scope, {**value, **output})
