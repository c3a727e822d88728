"""A LangGraph fan-out for tests: one model call per item, all sent at once (`Send`).

graph = fan_out(llm)  # compiled; input {"items": [...], "answers": []}
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import START, StateGraph
from langgraph.types import Send


class FanOut(TypedDict):
    items: list[str]
    answers: Annotated[list[str], operator.add]


def fan_out(llm: Any) -> Any:
    """Each item asked of `llm` in its own `ask_item` node; the answers gathered in `answers`."""

    async def ask_item(state: dict[str, str]) -> dict[str, Any]:
        return {"answers": [(await llm.ainvoke(state["item"])).content]}

    b = StateGraph(FanOut)
    b.add_node("ask_item", ask_item)
    b.add_conditional_edges(START, lambda s: [Send("ask_item", {"item": i}) for i in s["items"]], ["ask_item"])
    return b.compile()
