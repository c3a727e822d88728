"""What the real LLM engines share: decode outputs and sampling settings from node config.

Both the llama.cpp and the vLLM HTTP engine return a DECODE's `text` (+ `items` parsed
by the node's split unit when the node declares that port) and a PARTIAL_DECODE's chunk
of items, exactly as the simulated LLM does, so graphs run unchanged on any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from teola_core.engines.protocol import Call
from teola_core.ir.kinds import DECODE_KINDS, PREFILL_KINDS, PrimitiveKind
from teola_core.ir.kinds import LLM_KINDS as LLM_KINDS
from teola_core.ir.node import Node
from teola_core.ir.types import KVHandle

# The engines' names for the kind sets, which are declared once, in `teola_core.ir.kinds`.
PREFILLS, DECODES = PREFILL_KINDS, DECODE_KINDS


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading elements (tokens) two sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def decode_outputs(node: Node, text: str) -> dict[str, Any]:
    """A decode node's outputs for its generated text."""
    if node.kind == PrimitiveKind.DECODE:
        outputs: dict[str, Any] = {"text": text}
        if node.output_port("items") is not None:
            outputs["items"] = node.config["split_unit"].parse(text)
        return outputs
    if node.part is None:
        raise ValueError(f"{node.describe()} is a partial decode without its DecodePart")
    outputs = {"items": node.part.chunk(node.config["split_unit"].parse(text))}
    if node.output_port("text") is not None:
        outputs["text"] = text
    return outputs


def check_streamable(call: Call, engine: str) -> None:
    """Only decodes stream text: any other primitive asked to stream is the caller's mistake."""
    if call.node.kind not in DECODES:
        raise TypeError(f"{engine} can only stream decode primitives, not {call.node.describe()}")


def server_cached_prefill(call: Call, engine: str) -> dict[str, KVHandle]:
    """A PREFILL on an engine whose server keeps its own prefix cache: the handle only names the prompt.

    The decode sends the whole prompt and the server finds what is cached; a FULL_PREFILL's
    `prefix_kv` (from a partial prefill) must still be this engine's.
    """
    prompt = prompt_text(call.inputs.get("prompt"), "prompt", engine)
    if call.node.kind == PrimitiveKind.FULL_PREFILL and call.inputs.get("prefix_kv") is not None:
        own_handle(call.inputs["prefix_kv"], call, engine)
    return {"kv": KVHandle(engine, prompt)}


def prompt_text(value: Any, port: str, engine: str) -> str:
    """Prompts are text; say which port held something else."""
    if not isinstance(value, str):
        raise TypeError(f"{engine} takes text prompts; input {port!r} is {type(value).__name__}")
    return value


def stop_list(config: Any) -> list[str]:
    """The node's `stop` config as a list of strings (absent: none)."""
    stop = config.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return [str(s) for s in stop]


def own_handle(handle: Any, call: Call, engine: str) -> KVHandle:
    """`handle` as a KV handle of `engine`: decode where the prefill ran (errors name the node)."""
    if not isinstance(handle, KVHandle):
        raise TypeError(f"{call.node.describe()}: expected a KVHandle, got {type(handle).__name__}")
    if handle.engine != engine:
        raise ValueError(f"{call.node.describe()}: KV handle belongs to engine {handle.engine!r}, not {engine!r}")
    return handle
