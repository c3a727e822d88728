"""Deterministic apps for the server tests (served from `server_fakes:<name>`).

`SlowEcho` answers as a pure function of its prompt after a small simulated latency, on
the event loop (no threads), so the server's answer can be compared with calling the
app directly and the load test exercises the shared runtime. `Blocking` streams one
word then waits forever, reporting start and cancellation through threading events.
`Gated` answers once the test opens its gate (overload tests); `build_guarded_apps` adds
an app that fails mid-stream and one whose step hangs.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableGenerator, RunnableLambda

import teola


def reply(messages: list[BaseMessage]) -> str:
    prompt = "\n".join(f"{m.type}: {m.text}" for m in messages)
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    return f"[{digest}] you said {' '.join(prompt.split()[-4:])}"


class SlowEcho(BaseChatModel):
    """A chat model: deterministic answer, `delay` seconds of simulated latency."""

    delay: float = 0.005

    @property
    def _llm_type(self) -> str:
        return "slow-echo"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Any = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **_: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply(messages)))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: Any = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **_: Any,
    ) -> ChatResult:
        await asyncio.sleep(self.delay)
        return self._generate(messages)

    def _stream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for i, word in enumerate(reply(messages).split(" ")):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word if i == 0 else f" {word}"))

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        await asyncio.sleep(self.delay)
        for chunk in self._stream(messages):
            await asyncio.sleep(0)
            yield chunk


class Blocking(BaseChatModel):
    """Streams "hello", then waits until cancelled; `started`/`cancelled` are set on the way."""

    started: Any = None
    cancelled: Any = None

    @property
    def _llm_type(self) -> str:
        return "blocking"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("async only")

    async def _wait(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        await self._wait()
        raise AssertionError("unreachable")

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        yield ChatGenerationChunk(message=AIMessageChunk(content="hello"))
        await self._wait()


async def _explode_midway(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    n = 0
    async for chunk in chunks:
        yield chunk
        n += 1
        if n == 2:
            raise ValueError("broke after two chunks")


async def _hang(value: Any) -> str:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _explode(value: Any) -> str:
    raise ValueError(f"exploded on {value.to_string()[:20]!r}")


def build_apps() -> dict[str, Any]:
    """Fresh apps (and the blocking app's events) for one server."""
    started, cancelled = threading.Event(), threading.Event()
    question = ChatPromptTemplate.from_template("Answer briefly: {question}")
    apps: dict[str, Runnable[Any, Any]] = {
        # on the graph (`execution="graph"`): its primitives reach /metrics (a chain with nothing
        # for the graph to gain runs as LangChain runs it, and has no primitives to report)
        "chain": teola.optimize(question | SlowEcho() | StrOutputParser(), execution="graph"),
        "multi": ChatPromptTemplate.from_template("Context: {context}\nQ: {question}") | SlowEcho() | StrOutputParser(),
        "raw": SlowEcho(),
        "failing": question | RunnableLambda(_explode, name="explode"),
        "blocking": question | Blocking(started=started, cancelled=cancelled) | StrOutputParser(),
        "midway": question | SlowEcho() | StrOutputParser() | RunnableGenerator(_explode_midway, name="explode_midway"),
    }
    return {"apps": apps, "started": started, "cancelled": cancelled}


chain = ChatPromptTemplate.from_template("Answer briefly: {question}") | SlowEcho() | StrOutputParser()


class Gated(BaseChatModel):
    """Answers like `SlowEcho`, but each call first waits for `gate` (a threading.Event, in a
    worker thread); `entered` is released once per call that reached the model."""

    gate: Any = None
    entered: Any = None
    calls: Any = None  # a list: one entry per call that reached the model

    @property
    def _llm_type(self) -> str:
        return "gated"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply(messages)))])

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls.append(messages[-1].text)
        self.entered.release()
        await asyncio.to_thread(self.gate.wait)
        return self._generate(messages)


def build_guarded_apps() -> dict[str, Any]:
    """Apps for the overload and fault tests (one server per test module)."""
    gate, entered, calls = threading.Event(), threading.Semaphore(0), []
    started, cancelled = threading.Event(), threading.Event()
    question = ChatPromptTemplate.from_template("Answer briefly: {question}")
    apps: dict[str, Runnable[Any, Any]] = {
        "gated": question | Gated(gate=gate, entered=entered, calls=calls) | StrOutputParser(),
        # on the graph (`execution="graph"`): its primitives reach /metrics (a chain with nothing
        # for the graph to gain runs as LangChain runs it, and has no primitives to report)
        "chain": teola.optimize(question | SlowEcho() | StrOutputParser(), execution="graph"),
        "hung": question | RunnableLambda(_hang, name="hang"),
        "blocking": question | Blocking(started=started, cancelled=cancelled) | StrOutputParser(),
    }
    return {"apps": apps, "gate": gate, "entered": entered, "calls": calls, "started": started, "cancelled": cancelled}


not_an_app = 42
