"""Finished LangChain traces, in the form two runs of the same chain can be compared.

    recorder = TraceRecorder()
    await chain.ainvoke(x, {"callbacks": [recorder]})
    recorder.trees()   # each finished root run as a tree, as LangSmith would receive it

What a tree keeps of each run: name, run type, tags, inputs, outputs, the first line of
its error, and its children (a sorted list: concurrent siblings may start in either
order). Ids and times are left out, and so are the ids LangChain writes into messages
(they are named after the run) and the ids a server gives each response. This is
Teola's trace contract: for the same inputs the trees of a chain and of
`teola.optimize(chain)` are equal.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tracers.base import BaseTracer
from langchain_core.tracers.schemas import Run

_RUN_ID = re.compile(r"(run-|lc_run--)[0-9a-f-]{36}(-\d+)?")
_RESPONSE_ID = re.compile(r"chatcmpl-[0-9A-Za-z]+|cmpl-[0-9A-Za-z]+")  # an OpenAI-compatible server's, per request

Tree = tuple[Any, ...]


class TraceRecorder(BaseTracer):
    """Every finished root run, as a tracer (LangSmith's among them) receives it."""

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.roots.append(run)

    def trees(self) -> list[Tree]:
        """The finished root runs as trees, sorted (the order concurrent calls end in is timing)."""
        return sorted((run_tree(r) for r in self.roots), key=repr)


def run_tree(run: Run) -> Tree:
    """What a trace shows of a run and its children (see the module docstring)."""
    error = None if run.error is None else run.error.splitlines()[0]
    children = sorted((run_tree(c) for c in run.child_runs), key=repr)
    return (run.name, run.run_type, sorted(run.tags or []), _clean(run.inputs), _clean(run.outputs), error, children)


def first_difference(expected: Any, got: Any, path: str = "") -> str:
    """Where two trees (or lists of trees) first differ, for a readable message."""
    if type(expected) is not type(got) or not isinstance(expected, list | tuple):
        return f"at {path or 'top'}: expected {expected!r}\n     got {got!r}"
    if len(expected) != len(got):
        return f"at {path or 'top'}: {len(expected)} entries expected, {len(got)} got: {got!r}"
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        if a != b:
            return first_difference(a, b, f"{path}/{i}")
    return "(no difference)"


def without_message_ids(value: Any) -> Any:
    """`value` with the per-run ids of its messages dropped, everything else kept."""
    if isinstance(value, BaseMessage):
        return value.model_copy(update={"id": None})
    if isinstance(value, list | tuple):
        return type(value)(without_message_ids(v) for v in value)
    if isinstance(value, dict):
        return type(value)({k: without_message_ids(v) for k, v in value.items()})
    return value


def _clean(value: Any) -> Any:
    """A run payload without per-run ids, dicts in key order (a streamed parallel adds up its
    branches' chunks in the order they finish)."""
    text = _RUN_ID.sub("<run>", repr(_sorted(without_message_ids(value))))
    return _RESPONSE_ID.sub("<response>", text)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return sorted((repr(k), _sorted(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value
