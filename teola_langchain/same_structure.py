"""The structure of a runnable that runs another one: `teola.optimize`'s chains and agents.

LangChain reads a runnable's input and output types, their schemas and its config specs
(`with_types`, servers' schemas, tools made from runnables). An optimized runnable takes the
inputs and gives the outputs of the runnable it runs, so it answers with that one's.

    class Optimized(SameStructure, Runnable[Input, Output]):
        @property
        def _wrapped(self) -> Runnable[Any, Any]:
            return self.original
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig


class SameStructure:
    """Input and output types, their schemas and the config specs of `_wrapped` (see the module docstring)."""

    @property
    def _wrapped(self) -> Runnable[Any, Any]:
        """The runnable this one runs."""
        raise NotImplementedError

    @property
    def InputType(self) -> Any:
        return self._wrapped.InputType

    @property
    def OutputType(self) -> Any:
        return self._wrapped.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self._wrapped.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self._wrapped.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self._wrapped.config_specs
