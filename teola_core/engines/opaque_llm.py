"""An LLM engine over a model Teola cannot look inside (a framework's model object).

A LangChain chat model or a LlamaIndex `LLM` computes a prompt's state only when asked
to generate, so prefill primitives are lazy here: their KV handle holds the prompt,
and decode hands that prompt to the model. Each call runs on its own (the model
object has no batch API that returns what single calls would).

    class EchoModel(OpaqueModelEngine):
        async def generate(self, call, prompt):
            return str(prompt)
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from teola_core.engines.protocol import Call, EngineLimits, PerCallEngine
from teola_core.ir.kinds import LLM_KINDS, PrimitiveKind
from teola_core.ir.types import KVHandle


class OpaqueModelEngine(PerCallEngine):
    kinds = LLM_KINDS
    limits = EngineLimits(concurrency=64)
    driver_only = True  # it calls the user's model object with each query's callbacks and config

    @abstractmethod
    async def generate(self, call: Call, prompt: Any) -> Any:
        """The model's output for `prompt` (the decode node's config is on `call`)."""

    def decode_outputs(self, call: Call, output: Any) -> dict[str, Any]:
        """A decode's outputs: the text and, with a split unit, its parsed items."""
        outputs: dict[str, Any] = {"text": output}
        unit = call.node.config.get("split_unit")
        if unit is not None:
            outputs["items"] = unit.parse(output)
        return outputs

    def prompt_of(self, call: Call) -> Any:
        """The prompt a decode's KV handle holds (it must come from this engine)."""
        kv = call.inputs["kv"]
        if not isinstance(kv, KVHandle) or kv.engine != self.name:
            raise TypeError(f"{call.node.describe()} got KV state {kv!r}, not one of {self.name}")
        return kv.prompt

    async def run_call(self, call: Call) -> dict[str, Any]:
        kind = call.node.kind
        if kind in (PrimitiveKind.PREFILL, PrimitiveKind.FULL_PREFILL):
            return {"kv": KVHandle(self.name, call.inputs["prompt"])}
        if kind == PrimitiveKind.PARTIAL_PREFILL:
            return {"kv": KVHandle(self.name, call.inputs["prefix"])}
        if kind == PrimitiveKind.DECODE:
            return self.decode_outputs(call, await self.generate(call, self.prompt_of(call)))
        raise TypeError(f"{self.name} cannot run {call.node.describe()}")
