"""Zero-latency local stand-ins for the servers' models, for the overhead benchmark.

They compute what the simulated servers compute (the same responder text, a
deterministic embedding, the same rerank scores) with no network and no waiting, so
what is timed is LangChain's and Teola's own orchestration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from teola_adapters.simulated.reranker import relevance
from teola_adapters.simulated.servers import ExampleResponder, messages_to_prompt

_ROLES = {"human": "user", "ai": "assistant", "system": "system"}


class ResponderChat(BaseChatModel):
    """A chat model that answers instantly with the simulated server's text for the prompt."""

    max_tokens: int = 256

    @property
    def _llm_type(self) -> str:
        return "teola-responder-chat"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt = messages_to_prompt([{"role": _ROLES.get(m.type, m.type), "content": m.text} for m in messages])
        text = ExampleResponder()(prompt, self.max_tokens)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


class LocalReranker:
    """The simulated reranker's scores, computed in process (same interface as `HTTPReranker`)."""

    def rerank(self, query: str, docs: Sequence[Document], top_n: int) -> list[Document]:
        scores = [relevance(query, d.page_content) for d in docs]
        order = sorted(range(len(docs)), key=lambda i: -scores[i])
        return [docs[i] for i in order[:top_n]]

    async def arerank(self, query: str, docs: Sequence[Document], top_n: int) -> list[Document]:
        return self.rerank(query, docs, top_n)
