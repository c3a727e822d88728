"""Deterministic LangChain test doubles and the equivalence check used by the suite.

`EchoChat` and `EchoLLM` answer as a pure function of their prompt, so the original
chain and the optimized one can be called concurrently, in any order, and must agree.
(`FakeListChatModel` and `GenericFakeChatModel` are stateful: tests that use them build
a fresh chain for each run.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import LLM, BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.vectorstores import InMemoryVectorStore

from teola import optimize
from teola_benchmarks.langchain.traces import TraceRecorder, first_difference, without_message_ids

TOPICS = ["cats", "dogs", "rivers", "mountains", "jazz", "chess", "bread", "stars"]


def answer(prompt: str, style: str, n_items: int, stop: list[str] | None = None) -> str:
    """The fake model's answer: depends only on the prompt text."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:6]
    words = re.findall(r"[a-z]+", prompt.lower())
    topic = " ".join(words[-3:]) or "nothing"
    if style == "echo":
        text = f"[{digest}] about {topic}"
    elif style == "numbered":
        text = "Here you go:\n" + "\n".join(f"{i + 1}. {topic} {TOPICS[(i + len(digest)) % 8]}" for i in range(n_items))
    elif style == "lines":
        text = "\n".join(f"{TOPICS[i % 8]} {topic}" for i in range(n_items)) + "\n"
    elif style == "comma":
        text = ", ".join(f"{TOPICS[i % 8]} {digest[i]}" for i in range(n_items))
    elif style == "markdown":
        text = "\n".join(f"- {topic} {TOPICS[i % 8]}" for i in range(n_items))
    elif style == "json":
        text = "```json\n" + json.dumps({"topic": topic, "id": digest, "tags": TOPICS[:n_items]}) + "\n```"
    elif style == "json_list":
        text = json.dumps([f"{topic} {t}" for t in TOPICS[:n_items]])
    else:
        raise ValueError(style)
    for s in stop or []:
        text = text.split(s)[0]
    return text


def _prompt_text(messages: list[BaseMessage]) -> str:
    return "\n".join(f"{m.type}: {m.text}" for m in messages)


class EchoChat(BaseChatModel):
    """A chat model whose answer is a pure function of its messages (see `answer`)."""

    style: str = "echo"
    n_items: int = 3

    @property
    def _llm_type(self) -> str:
        return "echo-chat"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = answer(_prompt_text(messages), self.style, self.n_items, stop)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        text = answer(_prompt_text(messages), self.style, self.n_items, stop)
        for piece in re.split(r"(\s)", text):
            if piece:
                yield ChatGenerationChunk(message=AIMessageChunk(content=piece))


class EchoLLM(LLM):
    """A string LLM whose completion is a pure function of the prompt."""

    style: str = "echo"

    @property
    def _llm_type(self) -> str:
        return "echo-llm"

    def _call(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> str:
        return answer(prompt, self.style, 3, stop)


def make_store() -> InMemoryVectorStore:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
    docs = [
        Document(page_content=f"{t} note {i}: {TOPICS[(i * 3) % 8]} and {t}", metadata={"topic": t, "i": i})
        for i, t in enumerate(TOPICS * 3)
    ]
    store.add_documents(docs, ids=[f"d{i}" for i in range(len(docs))])
    return store


def format_docs(docs: list[Document]) -> str:
    return "\n".join(d.page_content for d in docs)


normalize = without_message_ids  # drop per-run message ids, keep everything else


def join_chunks(chunks: list[Any]) -> Any:
    """Chunks added up as LangChain adds them (`+`, else the last one wins)."""
    final: Any = None
    for i, chunk in enumerate(chunks):
        if i == 0:
            final = chunk
            continue
        try:
            final = final + chunk
        except TypeError:
            final = chunk
    return final


MODES = ("invoke", "ainvoke", "batch", "abatch", "stream", "astream")


def run_mode(runnable: Runnable[Any, Any], mode: str, inputs: list[Any], config: Any = None) -> Any:
    """Outputs of one calling convention, for every input."""
    if mode == "invoke":
        return [runnable.invoke(x, config) for x in inputs]
    if mode == "ainvoke":
        return asyncio.run(_gather(runnable, inputs, config))
    if mode == "batch":
        return runnable.batch(inputs, config)
    if mode == "abatch":
        return asyncio.run(runnable.abatch(inputs, config))
    if mode == "stream":
        return [list(runnable.stream(x, config)) for x in inputs]
    if mode == "astream":
        return [asyncio.run(_astream(runnable, x, config)) for x in inputs]
    raise ValueError(mode)


async def _gather(runnable: Runnable[Any, Any], inputs: list[Any], config: Any = None) -> list[Any]:
    return list(await asyncio.gather(*(runnable.ainvoke(x, config) for x in inputs)))


async def _astream(runnable: Runnable[Any, Any], x: Any, config: Any = None) -> list[Any]:
    return [chunk async for chunk in runnable.astream(x, config)]


def outcome(runnable: Runnable[Any, Any], mode: str, inputs: list[Any]) -> tuple[str, Any, list[Any]]:
    """("ok", outputs, run trees) or ("raised", the exception type, run trees)."""
    recorder = TraceRecorder()
    try:
        status, value = "ok", run_mode(runnable, mode, inputs, {"callbacks": [recorder]})
    except Exception as exc:
        status, value = "raised", type(exc)
    return status, value, recorder.trees()


def assert_equivalent(
    build: Callable[[], Runnable[Any, Any]],
    inputs: list[Any],
    *,
    modes: tuple[str, ...] = MODES,
    fresh: bool = False,
    exact_chunks: bool = False,
    traces: bool = True,
    **options: Any,
) -> None:
    """`optimize(chain)` gives what `chain` gives, for every mode (streams: joined chunks).

    A mode in which the chain raises must raise the same exception type; the traces
    (every callback run, as a tree) must be the same. Calls run on Teola's graph
    (`execution="graph"`) unless `options` say otherwise.
    fresh: build a new chain (and optimized chain) per mode, for stateful fakes.
    exact_chunks: streams must also yield the very same chunks.
    """
    options = {"execution": "graph", **options}
    chain, fast = build(), optimize(build(), **options)
    try:
        for mode in modes:
            if fresh:
                fast.close()
                chain, fast = build(), optimize(build(), **options)
            (status, expected, runs), (got_status, got, got_runs) = (
                outcome(chain, mode, inputs),
                outcome(fast, mode, inputs),
            )
            assert got_status == status, f"{mode}: {got_status} {got!r}, expected {status} {expected!r}"
            if traces and (status == "ok" or mode in ("invoke", "stream", "astream")):
                # (when concurrent queries raise, which of them have ended is a matter of timing)
                assert got_runs == runs, f"{mode}: the traces differ:\n{first_difference(runs, got_runs)}"
            if status == "raised":
                assert got is expected, f"{mode}: raised {got}, expected {expected}"
                continue
            if mode in ("stream", "astream"):
                if exact_chunks:
                    assert normalize(got) == normalize(expected), mode
                expected = [join_chunks(c) for c in expected]
                got = [join_chunks(c) for c in got]
            assert normalize(got) == normalize(expected), f"{mode}: {got!r} != {expected!r}"
    finally:
        fast.close()
