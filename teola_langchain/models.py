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

from langchain_core.language_models import BaseLanguageModel
from langchain_core.output_parsers.transform import BaseTransformOutputParser
from langchain_core.runnables import Runnable, RunnableBinding, RunnableGenerator, RunnableSequence


def language_model(step: Runnable[Any, Any]) -> BaseLanguageModel[Any] | None:
    """The model behind an LLM step, or None if the step is not one."""
    if isinstance(step, BaseLanguageModel):
        return step
    if type(step) is RunnableBinding and not step.config_factories and isinstance(step.bound, BaseLanguageModel):
        return step.bound
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
