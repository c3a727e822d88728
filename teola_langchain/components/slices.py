"""A step that keeps a slice of a list, proven from its code: `RunnableLambda(lambda qs: qs[:3])`.

Decode pipelining hands a model's list items to a `.map()` while the model still writes.
A step between the list parser and the map usually trims the list ("keep 3 queries"):
when its function's bytecode is exactly `return arg[a:b]` with constant, non-negative
bounds, the map's items are `items[a:b]` of what the model writes, known item by item,
so they can still pipeline. The step itself still runs, through its own `invoke`, on the
parser's whole list (its run and output are LangChain's); Teola only knows in advance
what it will return. Anything else (a comprehension, a closure, a negative bound, a
`RunnableLambda` subclass) is not a proven slice.

    list_slice(RunnableLambda(lambda qs: qs[:3]))    # slice(None, 3, None)
    list_slice(RunnableLambda(lambda qs: qs[-3:]))   # None
"""

from __future__ import annotations

import dis
import inspect
import types
from typing import Any

from langchain_core.output_parsers import BaseOutputParser
from langchain_core.runnables import RunnableLambda

from teola_core.ir.split_units import ItemParser
from teola_langchain.components.classes import class_of
from teola_langchain.components.parsers import ParserItems

_SKIP = frozenset({"RESUME", "NOP", "CACHE", "COPY_FREE_VARS"})
_LOAD_ARG = frozenset({"LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_FAST_CHECK"})


def list_slice(step: Any) -> slice | None:
    """The slice `step` keeps of its input list, if its code provably is `arg[a:b]` (see the module doc)."""
    if class_of(step) is not RunnableLambda or type(step) is not RunnableLambda:
        return None
    own = vars(step)
    if any(name in own for name in ("invoke", "ainvoke", "batch", "abatch")) or hasattr(step, "afunc"):
        return None
    fn = getattr(step, "func", None)
    if not isinstance(fn, types.FunctionType) or inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
        return None
    code = fn.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return None
    ops = [(i.opname, i.argval, i.argrepr) for i in dis.get_instructions(fn) if i.opname not in _SKIP]
    bounds = _bounds(ops, code.co_varnames[0])
    if bounds is None:
        return None
    start, stop = bounds
    if not all(b is None or (type(b) is int and b >= 0) for b in (start, stop)):
        return None
    return slice(start, stop)


def _bounds(ops: list[tuple[str, Any, str]], arg: str) -> tuple[Any, Any] | None:
    """(start, stop) when `ops` are `return arg[start:stop]` (Python 3.11 to 3.14 bytecode)."""
    if not ops or ops[0][0] not in _LOAD_ARG or ops[0][1] != arg or ops[-1][0] != "RETURN_VALUE":
        return None
    body = [(name, value) for name, value, _ in ops[1:-1]]
    repr_ = [r for _, _, r in ops[1:-1]]
    match body:
        case [("LOAD_CONST", start), ("LOAD_CONST", stop), ("BUILD_SLICE", 2), ("BINARY_SUBSCR", _)]:
            return start, stop
        case [("LOAD_CONST", start), ("LOAD_CONST", stop), ("BINARY_SLICE", _)]:
            return start, stop
        case [("LOAD_CONST", slice() as s), ("BINARY_OP", _)] if repr_[-1] == "[]" and s.step is None:
            return s.start, s.stop
    return None


def sliced_count(count: int | None, keep: slice) -> int | None:
    """How many items `keep` leaves of `count` (None when neither says)."""
    if count is not None:
        return len(range(count)[keep])
    if keep.stop is not None:
        return max(0, keep.stop - (keep.start or 0))
    return None


class SlicedItems(ParserItems):
    """The items `keep` selects of a parser's list: what a map after a proven slice iterates.

    `parse(text) == ParserItems(parser).parse(text)[keep]`; the incremental parser hands
    on an item as soon as the parser's own incremental parser has it and its index is in
    `keep`, so pipelined items are exactly the slice.
    """

    def __init__(self, output_parser: BaseOutputParser[Any], keep: slice) -> None:
        super().__init__(output_parser)
        self.keep = keep
        self.name = f"{self.name}[{keep.start or ''}:{'' if keep.stop is None else keep.stop}]"

    def parse(self, text: str) -> list[Any]:
        return super().parse(text)[self.keep]

    def parse_output(self, output: Any) -> list[Any]:
        return super().parse_output(output)[self.keep]

    def parser(self) -> ItemParser:
        return _SlicedParser(ParserItems(self.output_parser).parser(), self.keep)  # the whole list's parser

    def __repr__(self) -> str:
        return f"SlicedItems({type(self.output_parser).__name__}, {self.keep})"

    def __hash__(self) -> int:
        return hash((type(self), type(self.output_parser), self.keep.start, self.keep.stop))


class _SlicedParser(ItemParser):
    def __init__(self, inner: ItemParser, keep: slice) -> None:
        self._inner = inner
        self._start = keep.start or 0
        self._stop = keep.stop
        self._seen = 0

    def _kept(self, items: list[Any]) -> list[Any]:
        kept = []
        for item in items:
            if self._start <= self._seen and (self._stop is None or self._seen < self._stop):
                kept.append(item)
            self._seen += 1
        return kept

    def feed(self, delta: str) -> list[Any]:
        return self._kept(self._inner.feed(delta))

    def close(self) -> list[Any]:
        return self._kept(self._inner.close())
