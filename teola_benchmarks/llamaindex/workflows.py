"""The example workflows `teola bench --llamaindex` runs (llama-index-core 0.14; imported only when asked).

drafts_workflow: a `Workflow` whose first step writes three drafts of an answer at once
(`asyncio.gather` of `llm.acomplete`), and whose second step sums them up in one more
call; run as `await workflow.run(topic=question)`, its result the summary's text.

Its LLM is LlamaIndex's `OpenAILike` (package llama-index-llms-openai-like) at the
simulated server, not the bench's `ServerLLM` (a `CustomLLM`): Teola watches the load
of an `OpenAILike` / `OpenAI` client's vLLM-like server (`teola_adapters.server_load`),
so this example measures program-level order on a server that runs at most
`--max-num-seqs` requests at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from llama_index.core.llms import LLM
from llama_index.core.workflow import Event, StartEvent, StopEvent, Workflow, step
from llama_index.llms.openai_like import OpenAILike

ANGLES = ("the main facts", "the likely causes", "the practical consequences")
DRAFT = "Write a short draft answer to the question, focusing on {angle}.\nQuestion: {topic}\nAnswer in about 48 words."
SUMMARY = (
    "Combine these drafts into one final answer to the question.\nQuestion: {topic}\n"
    "Drafts:\n{drafts}\nAnswer in about 32 words."
)
TIMEOUT_S = 600.0
"""A run's timeout (LlamaIndex's default, 45 s, is shorter than a run queued on a full server)."""


MAX_RETRIES = 2
"""The `openai` client's own default. Not 0: a pooled connection left idle for the server's
keep-alive (uvicorn's, and vLLM's, 5 s; the client's pool keeps one as long) can be closed
by the server as the client reuses it, a connection error a retry resends. The plain
workflow keeps its connections busy; with calls held in Teola, connections its warm-up or
the plain run opened sit idle that long (seen once in three `--max-num-seqs 4` runs)."""


def server_llm(base_url: str, *, max_tokens: int = 256) -> OpenAILike:
    """A completion model on the simulated server (`/v1/completions`)."""
    return OpenAILike(
        model="sim-7b",
        api_base=base_url,
        api_key="x",
        is_chat_model=False,
        max_tokens=max_tokens,
        max_retries=MAX_RETRIES,
    )


class Drafted(Event):
    topic: str
    drafts: list[str]


class DraftsWorkflow(Workflow):
    """Three drafts of an answer at once, then a summary of them (see the module docstring)."""

    def __init__(self, llm: LLM, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.llm = llm

    @step
    async def draft(self, ev: StartEvent) -> Drafted:
        prompts = [DRAFT.format(angle=angle, topic=ev.topic) for angle in ANGLES]
        drafts = await asyncio.gather(*(self.llm.acomplete(p) for p in prompts))
        return Drafted(topic=ev.topic, drafts=[d.text for d in drafts])

    @step
    async def summary(self, ev: Drafted) -> StopEvent:
        drafts = "\n".join(f"- {d}" for d in ev.drafts)
        reply = await self.llm.acomplete(SUMMARY.format(topic=ev.topic, drafts=drafts))
        return StopEvent(result=reply.text)


def drafts_workflow(base_url: str) -> DraftsWorkflow:
    return DraftsWorkflow(server_llm(base_url), timeout=TIMEOUT_S)


WORKFLOWS: dict[str, Callable[[str], Workflow]] = {
    "drafts_workflow": drafts_workflow,
}
