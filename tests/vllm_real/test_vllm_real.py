"""VLLMHTTPEngine against a real vLLM server (vllm-cpu, SmolLM2-135M) on 127.0.0.1.

Skipped unless TEOLA_VLLM_URL (e.g. http://127.0.0.1:8011) and TEOLA_VLLM_MODEL (the
served model name) are set; `bash scripts/vllm-cpu/run-tests.sh` sets up the server and
runs this module. What the mocked tests (tests/engines/test_vllm_http.py) cannot show:

- the partial-prefill warm-up (token ids, whole blocks) really lands in vLLM's prefix
  cache: the later full request's prefix-cache hits, read from /metrics, cover it;
- streamed partial decoding yields items while the server is still generating;
- greedy outputs are the same with and without the optimization, and equal a plain
  `openai` completion.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

URL = os.environ.get("TEOLA_VLLM_URL", "")
MODEL = os.environ.get("TEOLA_VLLM_MODEL", "")
pytestmark = pytest.mark.skipif(
    not (URL and MODEL), reason="set TEOLA_VLLM_URL and TEOLA_VLLM_MODEL (see scripts/vllm-cpu/run-tests.sh)"
)

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("tenacity")

from teola_adapters.vllm_http import VLLMHTTPEngine  # noqa: E402
from teola_core.engines.protocol import Call  # noqa: E402
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of  # noqa: E402
from teola_core.ir.node import Node  # noqa: E402
from teola_core.ir.split_units import Lines, SplitUnit  # noqa: E402
from teola_core.ir.types import KVHandle, PortType  # noqa: E402

K = PrimitiveKind
T = TypeVar("T")
ENGINE = "llm"
# Filler that makes the prefix span several KV blocks (128 tokens on vllm-cpu); the nonce in front makes every
# run's prefix new to the server's cache, so hits can only come from this run's warm-up.
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


def run(coro: Coroutine[Any, Any, T], timeout: float = 180.0) -> T:
    """Run a coroutine with a time limit, so a hung server fails the test, not the suite."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


def node(kind: PrimitiveKind, split_unit: SplitUnit | None = None, **config: Any) -> Node:
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
    return Node(kind.value, kind, inputs, outputs, engine=ENGINE, config=config, caps=spec.caps)


def make_engine(block_size: int = 16) -> VLLMHTTPEngine:
    return VLLMHTTPEngine(URL, MODEL, name=ENGINE, timeout_s=60.0, retries=1, block_size=block_size)


async def metrics_text() -> str:
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(f"{URL.rstrip('/')}/metrics")
        response.raise_for_status()
    return response.text


async def server_block_size() -> int:
    """The server's KV block size, from `vllm:cache_config_info` (vllm-cpu 0.32 picks 128,
    not the GPU default 16): the engine must be told it, or its warm-ups over-count."""
    for line in (await metrics_text()).splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(","))
            return int(labels["block_size"].strip('"'))
    raise AssertionError("the server's /metrics has no vllm:cache_config_info")


def fresh_prefix() -> str:
    return f"Session {uuid.uuid4().hex}.\n{CONTEXT}"


async def prefix_cache_counters() -> dict[str, float]:
    """vLLM's prefix-cache counters (tokens): `queries` looked up, `hits` found cached."""
    text = await metrics_text()
    totals = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        if line.startswith("#") or "_created" in line:
            continue
        for key in totals:
            # vLLM V1: vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total
            if line.startswith(f"vllm:prefix_cache_{key}"):
                totals[key] += float(line.rsplit(" ", 1)[1])
    if not any(line.startswith("vllm:prefix_cache_hits") for line in text.splitlines()):
        raise AssertionError("the server's /metrics has no vllm:prefix_cache_hits counter")
    return totals


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


async def optimized(engine: VLLMHTTPEngine, prefix: str, prompt: str, max_tokens: int) -> tuple[KVHandle, str]:
    """PARTIAL_PREFILL(prefix) -> FULL_PREFILL(prompt) -> DECODE: Teola's rewritten chain."""
    warm = await engine.run_one(Call("q", node(K.PARTIAL_PREFILL), {"prefix": prefix}))
    full = await engine.run_one(Call("q", node(K.FULL_PREFILL), {"prompt": prompt, "prefix_kv": warm["kv"]}))
    out = await engine.run_one(Call("q", node(K.DECODE, max_tokens=max_tokens), {"kv": full["kv"]}))
    return warm["kv"], out["text"]


async def unoptimized(engine: VLLMHTTPEngine, prompt: str, max_tokens: int) -> str:
    """PREFILL(prompt) -> DECODE: the chain as the user wrote it."""
    pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": prompt}))
    out = await engine.run_one(Call("q", node(K.DECODE, max_tokens=max_tokens), {"kv": pre["kv"]}))
    return out["text"]


async def warm_then_full(block_size: int | None) -> dict[str, Any]:
    """A control request with no warm-up, then PARTIAL_PREFILL -> FULL_PREFILL -> DECODE on a
    fresh prefix, with the prefix-cache counters read around each step.

    block_size None: the engine adopts the server's (`use_server_block_size`)."""
    engine = make_engine(block_size or 16)
    try:
        if block_size is None:
            await engine.use_server_block_size()
        question = "Question: name one module.\nAnswer:"
        c0 = await prefix_cache_counters()
        await unoptimized(engine, fresh_prefix() + question, 8)
        cold = delta(await prefix_cache_counters(), c0)

        prefix = fresh_prefix()
        prompt = prefix + question
        m0 = await prefix_cache_counters()
        warm = await engine.run_one(Call("q", node(K.PARTIAL_PREFILL), {"prefix": prefix}))
        m1 = await prefix_cache_counters()
        full = await engine.run_one(Call("q", node(K.FULL_PREFILL), {"prompt": prompt, "prefix_kv": warm["kv"]}))
        await engine.run_one(Call("q", node(K.DECODE, max_tokens=8), {"kv": full["kv"]}))
        m2 = await prefix_cache_counters()
        return {
            "engine_block": engine.block_size,
            "server_block": await server_block_size(),
            "warm_ids": tuple(warm["kv"].token),
            "full_ids": tuple(await engine.tokenize(prompt)),
            "cold": cold,
            "warm_up": delta(m1, m0),
            "full": delta(m2, m1),
            "stats": engine.stats,
        }
    finally:
        await engine.close()


def report(tag: str, r: dict[str, Any]) -> None:
    print(
        f"\n[{tag}] server block {r['server_block']}, engine block {r['engine_block']};"
        f" warmed {len(r['warm_ids'])} of {len(r['full_ids'])} prompt tokens;"
        f" control (no warm-up) {r['cold']}; warm-up request {r['warm_up']}; full request {r['full']}"
    )


def test_partial_prefill_warm_up_is_hit_by_the_full_request() -> None:
    r = run(warm_then_full(None))
    report("prefix cache", r)
    block, held = r["server_block"], len(r["warm_ids"])
    assert r["engine_block"] == block  # use_server_block_size read /metrics right
    assert held >= 2 * block and held % block == 0
    # Token ids, not text: the warmed ids are exactly the start of the full prompt's ids.
    assert r["full_ids"][:held] == r["warm_ids"]
    assert r["stats"].warmups == 1 and r["stats"].warm_tokens == held
    assert r["cold"]["hits"] < block  # without warm-up, nothing of a fresh prefix is found
    assert r["warm_up"]["hits"] < block  # the warm-up itself finds nothing: it is first
    assert r["full"]["hits"] >= held  # every warmed block is found by the full request
    assert r["full"]["queries"] >= len(r["full_ids"]) - 1


def test_a_smaller_engine_block_size_warms_a_tail_the_server_does_not_cache() -> None:
    """Why `use_server_block_size` exists: with the GPU default 16 against vllm-cpu's 128,
    only the whole server blocks of the warm-up are hit; the rest was prefilled twice."""
    r = run(warm_then_full(16))
    report("block 16 vs server", r)
    held, server_block = len(r["warm_ids"]), r["server_block"]
    assert r["full_ids"][:held] == r["warm_ids"]
    assert r["full"]["hits"] == held // server_block * server_block


def test_streamed_partial_decode_delivers_items_before_the_call_ends() -> None:
    prompt = "Here is a list of ten fruits, one per line:\n1. Apple\n2."
    decode = node(K.PARTIAL_DECODE, split_unit=Lines(), max_tokens=80)

    async def main() -> tuple[list[tuple[float, str]], float, str]:
        engine = make_engine()
        try:
            pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": prompt}))
            parser = Lines().parser()
            timed_items: list[tuple[float, str]] = []
            deltas: list[str] = []
            began = time.perf_counter()
            async for piece in engine.stream(Call("q", decode, {"kv": pre["kv"]})):
                deltas.append(piece)
                now = time.perf_counter() - began
                timed_items += [(now, item) for item in parser.feed(piece)]
            ended = time.perf_counter() - began
            timed_items += [(ended, item) for item in parser.close()]
            return timed_items, ended, "".join(deltas)
        finally:
            await engine.close()

    timed_items, ended, text = run(main())
    first = timed_items[0][0] if timed_items else float("nan")
    print(f"\n[stream] {len(timed_items)} items; first item at {first:.3f}s, call ended at {ended:.3f}s")
    assert len(timed_items) >= 3, text
    assert [item for _, item in timed_items] == Lines().parse(text)  # pipelined == unsplit
    assert first < ended
    assert sum(1 for t, _ in timed_items if t < ended) >= 2  # several items, not only the last


def test_greedy_outputs_equal_with_and_without_the_optimization() -> None:
    prefix = fresh_prefix()
    prompt = prefix + "Question: which kinds of modules does the library ship? Answer in one sentence.\nAnswer:"
    max_tokens = 32

    async def main() -> tuple[str, str, str]:
        engine = make_engine()
        try:
            await engine.use_server_block_size()
            # Optimized first, so its warm-up is what the full request hits.
            _, text_optimized = await optimized(engine, prefix, prompt, max_tokens)
            text_plain = await unoptimized(engine, prompt, max_tokens)
            async with openai.AsyncOpenAI(base_url=f"{URL.rstrip('/')}/v1", api_key="EMPTY") as client:
                # A cache salt of its own: the reference is computed cold, from no cached KV.
                direct = await client.completions.create(
                    model=MODEL,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    temperature=0,
                    extra_body={"cache_salt": uuid.uuid4().hex},
                )
            return text_optimized, text_plain, direct.choices[0].text
        finally:
            await engine.close()

    text_optimized, text_plain, text_direct = run(main())
    print(f"\n[greedy] optimized == plain == direct: {text_optimized!r}")
    assert text_optimized.strip(), "the model generated nothing"
    assert text_optimized == text_plain == text_direct
