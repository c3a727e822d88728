"""The app the overload benchmark serves: a prompt, a 50 ms chat model, a parser.

The model waits its latency on the event loop (an asyncio sleep, as a remote model's
HTTP call would), so what limits the server is the server: HTTP, routing, the runtime.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate

LATENCY_S = 0.05


class FiftyMs(BaseChatModel):
    """Answers with the last words of its prompt after `latency_s`."""

    latency_s: float = LATENCY_S

    @property
    def _llm_type(self) -> str:
        return "fifty-ms"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        words = messages[-1].text.split()[-4:]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=" ".join(words)))])

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        await asyncio.sleep(self.latency_s)
        return self._generate(messages)


chain = ChatPromptTemplate.from_template("Answer briefly: {question}") | FiftyMs() | StrOutputParser()
