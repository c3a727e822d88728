"""What the tracer knows about a value while it walks a chain, before anything runs.

A LangChain step receives one Python value, and the tracer knows it as a graph port
(`Ref`). A `RunnableParallel` (or a dict literal, or `.assign`) builds a dict whose
fields come from *different* steps; every step still receives the whole dict, but the
tracer keeps where each field comes from (`DictValue`), so a prompt that reads
`question` and `context` from `{"context": retriever, "question": RunnablePassthrough()}`
can be planned to warm its ready start while the retriever runs (prefill split):

    Ref(value)                                   # one port
    Ref(value, plan)                             # a prompt's output, and how it is made
    DictValue(whole, {"q": a, "ctx": b})         # exactly these keys
    DictValue(whole, {"ctx": b}, rest=x)         # `.assign` on `x`, a dict whose keys are unknown

`MISSING` stands, at run time, for a dict key that is absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from teola_core.ir.builder import Value
from teola_core.ir.prompt import PromptPlan


class _Missing:
    """A dict key that is absent at run time (a prompt then reports it as LangChain does)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Ref:
    """A value on one port, as the chain computes it.

    plan: for a prompt's output, how the prompt is made from separately computed fields
    (so prefill split can warm its ready start; see `teola_core.ir.prompt.PromptPlan`).
    """

    value: Value
    plan: PromptPlan | None = None


@dataclass(frozen=True, eq=False)
class DictValue:
    """A dict a composite builds: the whole value, and where each known field comes from.

    `fields` serve planning (which prompt variables are ready when, which steps can start
    early: `early_steps.py`); every step receives `whole`, the dict the composite returned.
    `rest`: the dict also holds the keys of this value that `fields` does not name
    (`.assign` on an input whose keys are unknown); None: exactly `fields`.
    """

    whole: Value
    fields: dict[str, Value]
    rest: Value | None = None

    @property
    def open(self) -> bool:
        """The dict may hold keys beyond `fields`."""
        return self.rest is not None


Sym = Ref | DictValue


def carry(sym: Sym, value: Value) -> Sym:
    """`sym` as handed on through `value` (an open/close node): same fields, new whole."""
    if isinstance(sym, DictValue):
        return DictValue(value, sym.fields, sym.rest)
    return Ref(value, sym.plan)
