"""Which step of a LangChain run failed: the innermost run that raised, as LangChain's
callbacks report it, so an app's error can name the step (`AppFailed.step`)."""

from __future__ import annotations

from typing import Any


def failed_step_tracker() -> Any:
    """A LangChain callback handler whose `failed` is the name of the innermost run that
    raised (the step that failed), as LangChain's callbacks report it."""
    from langchain_core.callbacks import BaseCallbackHandler

    class FailedStep(BaseCallbackHandler):
        run_inline = True  # bookkeeping only: no thread hop
        teola_structure_only = True  # it records no run's output (decode pipelining may tap the model)

        def __init__(self) -> None:
            self.names: dict[Any, str] = {}
            self.failed: str | None = None

        def _start(self, serialized: Any, run_id: Any, name: str | None) -> None:
            self.names[run_id] = name or (serialized or {}).get("name") or "?"

        def _error(self, run_id: Any) -> None:
            if self.failed is None:  # children fail before their parents: the first is the step
                self.failed = self.names.get(run_id)

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_retriever_start(self, serialized: Any, query: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_tool_start(self, serialized: Any, input_str: Any, *, run_id: Any, **kw: Any) -> None:
            self._start(serialized, run_id, kw.get("name"))

        def on_chain_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_llm_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_retriever_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
            self._error(run_id)

    return FailedStep()
