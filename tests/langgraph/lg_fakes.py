"""Chat models for the LangGraph tests: answers are functions of the prompt, so runs in any order agree."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr


def answer(messages: list[BaseMessage]) -> str:
    """The model's answer: the last message's words reversed, with a fixed prefix."""
    return "echo " + " ".join(reversed(str(messages[-1].content).split()))


class EchoChat(BaseChatModel):
    """`answer(messages)`, streamed word by word when LangChain streams (stream_mode="messages")."""

    fail_on: str | None = None  # a prompt word that makes the call raise

    @property
    def _llm_type(self) -> str:
        return "echo-chat"

    def bind_tools(self, tools: Any, **kwargs: Any) -> EchoChat:
        """An agent binds its tools: this model never calls them."""
        return self

    def _answer(self, messages: list[BaseMessage]) -> str:
        if self.fail_on is not None and self.fail_on in str(messages[-1].content).split():
            raise ValueError(f"the model refuses {self.fail_on!r}")
        return answer(messages)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self._answer(messages)))])

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        for i, word in enumerate(self._answer(messages).split()):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word if i == 0 else " " + word))
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        for i, word in enumerate(self._answer(messages).split()):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word if i == 0 else " " + word))
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk


class GatedChat(BaseChatModel):
    """An async chat model whose calls answer when the test says: `started` lists prompts in
    the order the model began them; `release(prompt)` lets that call answer, `open()` every
    call from now on."""

    _started: list[str] = PrivateAttr(default_factory=list)
    _gates: dict[str, asyncio.Event] = PrivateAttr(default_factory=dict)
    _began: dict[str, asyncio.Event] = PrivateAttr(default_factory=dict)
    _open: bool = PrivateAttr(default=False)

    @property
    def _llm_type(self) -> str:
        return "gated-chat"

    @property
    def started(self) -> list[str]:
        return list(self._started)

    def _event(self, table: dict[str, asyncio.Event], prompt: str) -> asyncio.Event:
        return table.setdefault(prompt, asyncio.Event())

    def release(self, prompt: str) -> None:
        self._event(self._gates, prompt).set()

    def open(self) -> None:
        self._open = True
        for gate in self._gates.values():
            gate.set()

    async def began(self, prompt: str) -> None:
        """Returns once the model has begun the call with this prompt."""
        await self._event(self._began, prompt).wait()

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        raise NotImplementedError("GatedChat is async only")

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        prompt = str(messages[-1].content)
        self._started.append(prompt)
        self._event(self._began, prompt).set()
        if not self._open:
            await self._event(self._gates, prompt).wait()
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=answer(messages)))])


_MASKS = (
    (re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"), "<uuid>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?"), "<time>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<hex-id>"),  # interrupt ids: a hash of the (time-based) checkpoint
)


def masked(value: Any) -> str:
    """A comparable text: ids, timestamps and addresses masked (they differ run to run in LangGraph itself)."""
    text = repr(value)
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text
