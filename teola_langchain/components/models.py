"""Chat models and LLMs: which steps become LLM primitives, and the streaming tail.

Any `BaseLanguageModel` (`BaseChatModel`, `BaseLLM`) is an LLM primitive, and so is a
`RunnableBinding` around one (`model.bind(stop=...)`, `bind_tools`, `with_config`)
when it has no config factories (listeners): the engine calls that binding's `ainvoke`,
so bound kwargs and config apply exactly as in LangChain.

Streaming: LangChain streams a sequence through its last steps that transform chunk by
chunk. A model followed only by such steps (parsers that transform, generators) is the
sequence's *streaming tail*: Teola runs the steps before it as a graph and then streams
the tail with LangChain's own `stream`/`astream`, so the chunks are LangChain's chunks.
Every model input-buffers (it needs its whole prompt), which is why feeding it the
head's final value gives the same stream as the original chain.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseLanguageModel, chat_models
from langchain_core.output_parsers import StrOutputParser
from langchain_core.output_parsers.transform import BaseTransformOutputParser
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableBranch,
    RunnableGenerator,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
    RunnableSequence,
    RunnableWithFallbacks,
)
from langchain_core.runnables.base import RunnableEach
from langchain_core.runnables.passthrough import RunnableAssign

from teola_langchain.components.classes import class_of
from teola_langchain.components.prompts import PROMPT_TYPES

# An LLM's max_tokens when the model does not say: an estimate for scheduling only.
DEFAULT_MAX_TOKENS = 256

# `BaseChatModel.bind` returns `_ChatModelBinding`, a `RunnableBinding` that only narrows
# types ("at runtime this is a plain RunnableBinding"); older cores return RunnableBinding.
BINDING_TYPES: tuple[type, ...] = tuple(
    t for t in (RunnableBinding, getattr(chat_models, "_ChatModelBinding", None)) if t is not None
)


def is_binding(step: object) -> bool:
    """A plain `RunnableBinding` (exact class: retry and other subclasses change behaviour)."""
    return class_of(step) in BINDING_TYPES


def language_model(step: Runnable[Any, Any]) -> BaseLanguageModel[Any] | None:
    """The model behind an LLM step, or None if the step is not one."""
    if isinstance(step, BaseLanguageModel):
        return step
    if is_binding(step) and not step.config_factories and isinstance(step.bound, BaseLanguageModel):  # type: ignore[attr-defined]
        return step.bound  # type: ignore[attr-defined]
    return None


def _streams_chunks(step: Runnable[Any, Any]) -> bool:
    return isinstance(step, BaseTransformOutputParser | RunnableGenerator)


def streaming_split(runnable: Runnable[Any, Any]) -> tuple[Runnable[Any, Any] | None, Runnable[Any, Any]] | None:
    """(head, tail) when the chain ends in a model and chunk-transforming steps.

    head is None when the model is the first step (the whole chain is the tail).
    """
    if type(runnable) is RunnableSequence:
        steps = list(runnable.steps)
    elif language_model(runnable) is not None:
        return None, runnable
    else:
        return None
    for i in range(len(steps) - 1, -1, -1):
        if language_model(steps[i]) is not None:
            break
        if not _streams_chunks(steps[i]):
            return None
    else:
        return None
    head = _join(steps[:i])
    tail = _join(steps[i:])
    assert tail is not None
    return head, tail


def _join(steps: list[Runnable[Any, Any]]) -> Runnable[Any, Any] | None:
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]
    return RunnableSequence(*steps)


def streams_as_invoked(step: Runnable[Any, Any]) -> bool:
    """Whether LangChain's stream of `step`, chunks added up, is provably its invoke output.

    Where it is, Teola may compute that part of a stream as a graph (invoke semantics).
    LangChain's streaming differs from its invoke in places: `RunnablePick` drops None
    values, cumulative parsers (JSON) inside a parallel concatenate their partial
    results, list parsers split items with their own streaming rules, `RunnableRetry`
    does not retry a stream, generators see chunks instead of one value, and a model's
    chunks add up to a message *chunk*. Such steps make this False, and the optimized
    runnable then streams through the original chain.
    """
    kind = class_of(step)
    if kind is RunnableSequence:
        steps = list(step.steps)
        for i, s in enumerate(steps):
            if language_model(s) is not None:
                if not (i + 1 < len(steps) and class_of(steps[i + 1]) is StrOutputParser):
                    return False
            elif not streams_as_invoked(s):
                return False
        return True
    if kind is RunnableParallel:
        return all(streams_as_invoked(s) for s in step.steps__.values())
    if kind is RunnableAssign:
        return streams_as_invoked(step.mapper)
    if kind is RunnableBranch:
        parts = [r for pair in step.branches for r in pair] + [step.default]
        return all(streams_as_invoked(s) for s in parts)
    if is_binding(step):
        return not step.config_factories and language_model(step) is None and streams_as_invoked(step.bound)  # type: ignore[attr-defined]
    if isinstance(step, RunnableWithFallbacks):
        return all(streams_as_invoked(s) for s in step.runnables)
    if kind in (RunnablePassthrough, RunnableLambda, RunnableEach, StrOutputParser):
        return True
    return kind in PROMPT_TYPES or isinstance(step, BaseRetriever)
