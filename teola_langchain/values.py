"""What the tracer knows about a value while it walks a chain, before anything runs.

A LangChain step receives one Python value. Most of the time the tracer only knows
that value as a graph port (`Ref`). But a `RunnableParallel` (or a dict literal, or
`.assign`) builds a dict whose fields come from *different* upstream steps, and the
point of tracing is to keep them apart: a prompt that reads `question` and `context`
from `{"context": retriever, "question": RunnablePassthrough()}` should see that
`question` is ready long before `context` (prefill split), and `itemgetter("question")`
should not wait for the retriever. So a dict built by the chain stays a `DictValue` of
per-field values until a step needs the whole dict, when the tracer materialises it
with one cheap inline node.

    Ref(value)                              # a port; `items` is the same value as a
                                            # list port a map can consume item by item
    DictValue({"q": Ref(a), "ctx": Ref(b)}) # exactly these keys, in this order
    DictValue({"ctx": Ref(b)}, base=c)      # `{**c, "ctx": ...}` where c's keys are
                                            # unknown until run time (.assign on input)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teola_core.ir.builder import Value


class _Missing:
    """A dict key that is absent at run time (a prompt then reports it as LangChain does)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Ref:
    """A value produced on one graph port.

    items: when set, a port carrying `list(value)` that is produced item by item (an
    LLM decode with a split unit): a following map consumes it so it can be pipelined.
    """

    value: Value
    items: Value | None = None


@dataclass(frozen=True, eq=False)
class DictValue:
    """A dict the chain builds from separately traced fields (see the module docstring)."""

    fields: dict[str, Sym] = field(default_factory=dict)
    base: Value | None = None


Sym = Ref | DictValue
