"""What one step yields when it runs: its outputs, or the exception its query fails with.

The local runtime decides when a step runs and where its outcome goes; these functions
run one step (an inline primitive, a user step, an engine batch, an engine stream) under
its deadline and turn every failure into a value: a deadline names its step
(`timeouts.step_timeout`), a failed batch gives each call its own copy (`failures`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from teola_core.engines.protocol import Call, Engine, StreamResult
from teola_core.ir.node import Node
from teola_core.runtime.engine_free import run_inline, run_user
from teola_core.runtime.failures import checked_results, own_copies
from teola_core.runtime.timeouts import DeadlineExpired, step_timeout, within

Outcome = Mapping[str, Any] | BaseException


def inline_outcome(node: Node, inputs: Mapping[str, Any]) -> Outcome:
    """A format, aggregate or output primitive, computed in place."""
    try:
        return run_inline(node, inputs)
    except Exception as exc:
        return exc


async def user_step_outcome(node: Node, inputs: Mapping[str, Any], timeout: float) -> Outcome:
    """A call's function or a condition's predicate, within `timeout` seconds."""
    try:
        return await within(run_user(node, inputs), timeout)
    except DeadlineExpired as exc:
        return step_timeout(node, timeout, exc)
    except Exception as exc:
        return exc


async def engine_batch_outcomes(engine: Engine, calls: Sequence[Call], timeout: float) -> list[Outcome]:
    """One outcome per call of an engine batch run within `timeout` seconds."""
    try:
        return checked_results(engine.name, len(calls), await within(engine.run(calls), timeout))
    except DeadlineExpired as exc:  # each call fails naming its own step
        own, n = engine.limits.timeout_s is not None, len(calls)
        return [step_timeout(c.node, timeout, exc, engine=engine.name, own_limit=own, batch=n) for c in calls]
    except Exception as exc:  # the whole batch failed: each call fails with its own copy
        return own_copies(exc, len(calls))


async def engine_stream_outcome(
    engine: Engine, call: Call, timeout: float, on_delta: Callable[[str], None]
) -> tuple[Any, BaseException | None]:
    """An engine stream run within `timeout` seconds, each text delta handed to `on_delta`:
    (its final value, None) when it closed, (None, the error) when it failed."""

    async def consume() -> Any:
        final = None
        async for delta in engine.stream(call):
            if isinstance(delta, StreamResult):
                final = delta.value
            else:
                on_delta(delta)
        return final

    try:
        return await within(consume(), timeout), None
    except DeadlineExpired as exc:
        own_limit = engine.limits.timeout_s is not None
        return None, step_timeout(call.node, timeout, exc, engine=engine.name, own_limit=own_limit)
    except Exception as exc:
        return None, exc
