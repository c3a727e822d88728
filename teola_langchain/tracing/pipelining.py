"""Decode pipelining into a `.map()`: each item a model writes goes to the map's body at once.

In a sequence, `model | list parser | .map(body)` (optionally with a proven list slice
before the map, `components/slices.py`) is pipelined when the number of items is known:
`expected_items=`, or learned from the parser's past outputs (`TraceSession.counts`).
The model's decode then also yields its parsed items, and the body (a step that batches
per item, a retriever's EMBED + SEARCH, or a `ContextualCompressionRetriever`'s graph per
item) runs on each while the model writes the next.
Where only the count or the shape is missing, a note says so for explain() (`Blocked`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.runnables.base import RunnableEach

from teola_langchain.components import compression
from teola_langchain.components.classes import class_of
from teola_langchain.components.models import language_model
from teola_langchain.components.parsers import ParserItems, is_recognised
from teola_langchain.components.patched import runs_own_code
from teola_langchain.components.retrievers import Decomposition, decompose
from teola_langchain.components.slices import SlicedItems, list_slice, sliced_count
from teola_langchain.execution import steps
from teola_langchain.execution.context import StepRef
from teola_langchain.tracing.step_nodes import StepNodes
from teola_langchain.tracing.values import Ref, Sym


@dataclass(frozen=True)
class Pipeline:
    """`model | parser | [trim] | each`, pipelined for `n` items (`keep`: the slice `trim` takes)."""

    model: Any
    parser: Any
    trim: Any
    keep: slice | None
    each: Any
    n: int


class PipelinedMaps(StepNodes):
    """Finds and adds the `model | list parser | [slice] | .map(body)` runs of a sequence."""

    def _pipelinable(self, chain: list[Runnable[Any, Any]], i: int, scope: str) -> Pipeline | None:
        """Steps i.. are `model | list parser | [proven slice] | .map(body)` and the number of
        items is known (`expected_items=`, or learned): the plan to pipeline them; else None
        (and, where only the count or the shape is missing, a note for explain())."""
        if i + 2 >= len(chain) or language_model(chain[i]) is None:
            return None
        model, parser = chain[i], chain[i + 1]
        keep = list_slice(chain[i + 2]) if i + 3 < len(chain) else None
        trim = chain[i + 2] if keep is not None else None
        each = chain[i + 3] if keep is not None else chain[i + 2]
        if not _is_map(each):
            if i + 3 < len(chain) and _is_map(chain[i + 3]) and is_recognised(parser):
                self._block(
                    chain[i + 2],
                    StepRef(scope, f"seq:step:{i + 3}"),
                    "it stands between the list parser and the .map(), and is not a list slice Teola can prove, "
                    "so the model's items cannot go to the map while it writes",
                    "put the .map() right after the parser, or keep items with a plain `lambda xs: xs[:k]`",
                )
            return None
        parser_ref = StepRef(scope, f"seq:step:{i + 2}")
        if not is_recognised(parser):
            self._block(
                parser,
                parser_ref,
                "a .map() follows it, but Teola cannot read this parser's items as the model writes them",
                "use a list parser Teola streams: teola_langchain.LineListOutputParser, "
                "NumberedListOutputParser or MarkdownListOutputParser",
            )
            return None
        body = each.bound
        decomposable = isinstance(decompose(body) if isinstance(body, BaseRetriever) else None, Decomposition)
        if not decomposable and not steps.batches_per_item(body):
            return None
        count = self.session.items_of(self.key(parser, parser_ref))
        n = count if keep is None else sliced_count(count, keep)
        if n is None or n < 2:
            why = (
                "the number of items it writes is not known yet (it is learned from the parser's outputs "
                "after a few calls)"
                if n is None
                else f"it writes {count} item(s), {n} of which reach the map: nothing to overlap"
            )
            self._block(
                model,
                StepRef(scope, f"seq:step:{i + 1}"),
                f"decode pipelining into the .map() is not planned: {why}",
                "pass expected_items=N to plan it from the first call" if n is None else "nothing to change",
            )
            return None
        return Pipeline(model, parser, trim, keep, each, n)

    def pipelined(self, p: Pipeline, sym: Sym, scope: str, i: int) -> Sym:
        """model | list parser | [slice] | .map(body): each item goes to the body while the model writes the next.

        The model streams (its own `stream`); the parser (and the slice step) run on its
        whole output, as always; the map's run opens when the model starts, its callbacks
        (and its body's) recorded until the parser's output reaches it, then handed on with
        that list as its input; if the model or the parser fails, they are dropped. With a
        slice, the decode's items are the slice of the parser's (`SlicedItems`), checked
        against the slice step's own output at the end.
        """
        unit = ParserItems(p.parser) if p.keep is None else SlicedItems(p.parser, p.keep)
        text, items = self.model(p.model, sym, StepRef(scope, f"seq:step:{i + 1}"), unit=(unit, p.n))
        given = self.leaf(p.parser, Ref(text), StepRef(scope, f"seq:step:{i + 2}"), None)
        if p.trim is not None:
            given = self.leaf(p.trim, given, StepRef(scope, f"seq:step:{i + 3}"), None)
        label = p.each.get_name()
        each_ref = StepRef(scope, f"seq:step:{i + (4 if p.trim is not None else 3)}")
        each_scope = self._scope(label)
        self.paths[each_scope] = self.key(p.each, each_ref, "map")
        opened = self._user(
            steps.open_run(each_scope, each_ref, label, streaming=True),
            {"value": self.whole(sym)},
            "open",
            label,
        )
        element = StepRef(each_scope, None)
        body = p.each.bound
        plan = decompose(body) if isinstance(body, BaseRetriever) else None
        if isinstance(plan, Decomposition):
            out = self._retrieve(body, plan, items, element, after=opened)
        elif compression.traces(body):  # its own primitives per item, each item as a map element
            sub = self.nested_graph(f"{self.name}/{label}", body, element)
            key = self.key(body, element)
            out = self._itemwise(steps.run_items(sub), {"items": items, "after": opened}, "map", label, key=key)
        else:
            key = self.key(body, element, "leaf")
            out = self._itemwise(
                steps.invoke_items(body, element), {"items": items, "after": opened}, "map", label, key=key
            )
        reached = self.b.call(
            steps.reach_open(each_scope), {"value": self.whole(given), "ctx": self.ctx}, name="reached", inline=True
        )
        inputs = {"value": out, "inputs": reached}
        close = steps.close_run(each_scope)
        if p.trim is not None:
            inputs["items"] = items
            close = steps.close_sliced_map(each_scope)
        return Ref(self._user(close, inputs, "close", label))


def _is_map(step: Any) -> bool:
    return class_of(step) is RunnableEach and runs_own_code(step, RunnableEach)
