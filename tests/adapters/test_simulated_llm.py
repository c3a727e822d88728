"""Simulated LLM: prefix cache, partial prefill, continuous batching, streaming, lifecycle."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llm_nodes import decode_node, prefill_node

from teola_adapters.simulated import PrefixCache, SimClock, SimLLM, pseudo_words, run_virtual, token_pieces, tokens_of
from teola_adapters.simulated.paper_profiles import LLM
from teola_adapters.simulated.virtual_time import VirtualTimeLoop
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PortSpec, PrimitiveKind
from teola_core.ir.node import DecodePart, Node
from teola_core.ir.split_units import Lines
from teola_core.ir.types import KVHandle, PortType
from teola_core.runtime.engine_free import decode_chunk

PROMPT = " ".join(f"w{i}" for i in range(40))


def ok(result: Any) -> Any:
    assert not isinstance(result, BaseException), result
    return result


async def prefill(llm: SimLLM, prompt: str) -> KVHandle:
    return (await llm.run_one(Call("q", prefill_node(), {"prompt": prompt})))["kv"]


async def generate(llm: SimLLM, prompt: str, max_tokens: int = 20) -> str:
    kv = await prefill(llm, prompt)
    return (await llm.run_one(Call("q", decode_node(max_tokens), {"kv": kv})))["text"]


def lines_responder(prompt: str, max_tokens: int) -> str:
    return "\n".join(f"query {i} for {prompt.split()[0]}" for i in range(4))


def test_tokens_and_pieces() -> None:
    text = "first line here\n  second line\nthird "
    pieces = token_pieces(text)
    assert "".join(pieces) == text and len(pieces) == len(tokens_of(text)) == 6
    assert token_pieces("") == [] and token_pieces("  ") == ["  "]
    assert len(tokens_of(pseudo_words("p", 17))) == 17 and pseudo_words("p", 5) == pseudo_words("p", 5)
    assert pseudo_words("p", 5) != pseudo_words("other", 5)


def test_decode_text_comes_from_the_responder_capped_by_max_tokens() -> None:
    async def main() -> tuple[str, str, str, dict[str, Any]]:
        llm = SimLLM(LLM, time_scale=0)
        default = await generate(llm, PROMPT, 12)
        again = await generate(llm, PROMPT, 12)
        capped = SimLLM(LLM, time_scale=0, responder=lambda p, n: "one two three four five")
        short = await generate(capped, PROMPT, 3)
        lines = SimLLM(LLM, time_scale=0, responder=lines_responder)
        kv = await prefill(lines, PROMPT)
        out = await lines.run_one(Call("q", decode_node(64, items=True, split_unit=Lines()), {"kv": kv}))
        return default, again, short, dict(out)

    default, again, short, out = asyncio.run(main())
    assert default == again and len(tokens_of(default)) == 12
    assert short == "one two three"
    assert out["text"] == lines_responder(PROMPT, 64) and out["items"] == Lines().parse(out["text"])


def test_prefix_cache_reuses_whole_blocks_and_saves_time() -> None:
    shared = " ".join(f"s{i}" for i in range(1000))  # 1000 shared tokens: 62 whole blocks

    async def main(cache: bool) -> tuple[SimLLM, float, float]:
        loop = asyncio.get_running_loop()  # virtual time: each prefill takes its profiled latency, exactly
        llm = SimLLM(LLM, time_scale=1.0, prefix_cache=cache)
        began = loop.time()
        await prefill(llm, shared + " first question")
        cold = loop.time() - began
        began = loop.time()
        await prefill(llm, shared + " second question here")
        warm = loop.time() - began
        await llm.close()
        return llm, cold, warm

    llm, cold, warm = run_virtual(main(True))
    s = llm.stats
    assert s.cache_hit_tokens == 62 * 16 and s.prefill_tokens == 1002 + (1003 - 992)
    assert s.prompt_tokens == s.prefill_tokens + s.cache_hit_tokens + s.handle_hit_tokens
    assert s.busy_s == pytest.approx(LLM.latency("prefill", 1002) + LLM.latency("prefill", 11))
    assert cold == pytest.approx(LLM.latency("prefill", 1002)) and warm == pytest.approx(LLM.latency("prefill", 11))
    assert warm < cold / 2  # 0.27 s vs 0.02 s

    off, cold, warm = run_virtual(main(False))
    assert off.stats.cache_hit_tokens == 0 and off.stats.prefill_tokens == 1002 + 1003
    assert warm == pytest.approx(LLM.latency("prefill", 1003)) and warm > cold / 2  # no cache: no saving


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    prompt = " ".join(f"t{i}" for i in range(32))  # exactly two blocks

    async def main() -> SimLLM:
        llm = SimLLM(LLM, time_scale=0)
        await prefill(llm, prompt)
        await prefill(llm, prompt)
        return llm

    s = asyncio.run(main()).stats
    assert s.cache_hit_tokens == 16 and s.prefill_tokens == 32 + 16  # like vLLM: logits need the last token


def test_prefix_cache_is_lru_within_its_capacity() -> None:
    cache = PrefixCache(capacity_tokens=32)
    a, b = cache.keys([f"a{i}" for i in range(32)]), cache.keys([f"b{i}" for i in range(16)])
    cache.use(a)
    assert cache.probe(a) == 2
    cache.use(b)  # evicts a's deepest block first
    assert cache.probe(a) == 1 and cache.probe(b) == 1 and len(cache) == 2
    assert cache.keys([f"a{i}" for i in range(20)]) == a[:1]  # a partial block is never a key


def test_partial_prefill_then_full_prefill_computes_only_the_rest() -> None:
    prefix = " ".join(f"p{i}" for i in range(24))  # one whole block + 8 tokens
    prompt = prefix + " " + " ".join(f"c{i}" for i in range(30))

    async def main(cache: bool) -> SimLLM:
        llm = SimLLM(LLM, time_scale=0, prefix_cache=cache)
        part = prefill_node(PrimitiveKind.PARTIAL_PREFILL)
        full = prefill_node(PrimitiveKind.FULL_PREFILL)
        kv = (await llm.run_one(Call("q", part, {"prefix": prefix})))["kv"]
        kv = (await llm.run_one(Call("q", full, {"prompt": prompt, "prefix_kv": kv})))["kv"]
        assert kv == KVHandle("llm", prompt)
        return llm

    for cache in (True, False):
        s = asyncio.run(main(cache)).stats
        assert s.prefill_tokens == 54  # the 24 prefix tokens once, then the 30 others
        assert s.cache_hit_tokens == (16 if cache else 0) and s.handle_hit_tokens == (8 if cache else 24)


def test_continuous_batching_shares_decode_steps() -> None:
    async def main(together: bool) -> SimLLM:
        llm = SimLLM(LLM, time_scale=0)
        kvs = [await prefill(llm, f"prompt number {i}") for i in range(2)]
        calls = [Call(f"q{i}", decode_node(20), {"kv": kv}) for i, kv in enumerate(kvs)]
        if together:
            await asyncio.gather(llm.run([calls[0]]), llm.run([calls[1]]))  # two batches join one running set
        else:
            for call in calls:
                await llm.run_one(call)
        return llm

    base = 2  # the two prefill steps
    joint, alone = asyncio.run(main(True)).stats, asyncio.run(main(False)).stats
    assert joint.steps == base + 20 and joint.max_running == 2 and joint.decode_tokens == 40
    assert alone.steps == base + 40 and alone.max_running == 1 and alone.decode_tokens == 40
    decode_joint = joint.busy_s - 2 * LLM.latency("prefill", 3)
    assert decode_joint == pytest.approx(20 * LLM.latency("decode", 2))
    assert joint.busy_s < alone.busy_s


def test_stream_yields_items_before_the_end_and_equals_decode() -> None:
    async def main() -> tuple[str, list[int], list[tuple[int, str]], str]:
        llm = SimLLM(LLM, time_scale=0, responder=lines_responder)
        kv = await prefill(llm, PROMPT)
        call = Call("q", decode_node(64, items=True, split_unit=Lines()), {"kv": kv})
        steps_at: list[int] = []
        items_at: list[tuple[int, str]] = []
        parser, text = Lines().parser(), ""
        async for delta in llm.stream(call):
            steps_at.append(llm.stats.steps)
            text += delta
            items_at.extend((llm.stats.steps, item) for item in parser.feed(delta))
        items_at.extend((llm.stats.steps, item) for item in parser.close())
        decoded = (await llm.run_one(call))["text"]
        return text, steps_at, items_at, decoded

    text, steps_at, items_at, decoded = asyncio.run(main())
    assert text == decoded
    assert len(steps_at) == len(tokens_of(text)) == 16
    assert steps_at[0] < steps_at[-1]  # the first delta arrives steps before the last
    assert [item for _, item in items_at] == Lines().parse(text)
    assert items_at[0][0] < items_at[-1][0]  # the first line is parsed while the rest is being written


def test_a_stream_closed_early_leaves_the_running_set() -> None:
    async def main() -> tuple[int, int]:
        llm = SimLLM(LLM, time_scale=0)
        kv = await prefill(llm, PROMPT)
        stream = llm.stream(Call("q", decode_node(200), {"kv": kv}))
        async for _ in stream:
            break
        await stream.aclose()
        after_close = llm.stats.steps
        await generate(llm, "another prompt", 5)
        return llm.stats.steps - after_close, llm.stats.decode_tokens

    extra_steps, decoded = asyncio.run(main())
    assert extra_steps <= 1 + 1 + 5 and decoded < 20  # the abandoned 200-token decode stopped


def test_partial_decode_returns_its_chunk_of_the_items() -> None:
    async def main() -> list[Any]:
        llm = SimLLM(LLM, time_scale=0, responder=lines_responder)
        kv = await prefill(llm, PROMPT)
        calls = []
        for i in range(3):
            pd = Node(
                f"pd{i}",
                PrimitiveKind.PARTIAL_DECODE,
                (PortSpec("kv", PortType.KV),),
                (PortSpec("items", PortType.ITEMS),),
                engine="llm",
                config={"max_tokens": 64, "split_unit": Lines()},
                part=DecodePart("g", i, 3),
            )
            calls.append(Call("q", pd, {"kv": kv}))
        return [ok(r)["items"] for r in await llm.run(calls)]

    items = Lines().parse(lines_responder(PROMPT, 64))
    assert asyncio.run(main()) == [decode_chunk(items, i, 3) for i in range(3)]


def test_errors_fail_their_call_only() -> None:
    async def main() -> list[Any]:
        llm = SimLLM(LLM, time_scale=0)
        good = await prefill(llm, PROMPT)
        return await llm.run(
            [
                Call("q", decode_node(), {"kv": good}),
                Call("q", decode_node(), {"kv": KVHandle("other-llm", PROMPT)}),
                Call("q", prefill_node(), {"prompt": ["not", "text"]}),
                Call("q", decode_node(), {}),
            ]
        )

    good, foreign, not_text, no_kv = asyncio.run(main())
    assert ok(good)["text"]
    assert isinstance(foreign, ValueError) and "other-llm" in str(foreign)
    assert isinstance(not_text, TypeError) and isinstance(no_kv, KeyError)


def test_idle_engine_does_no_steps_and_close_fails_running_calls() -> None:
    async def main() -> tuple[int, int, Any]:
        llm = SimLLM(LLM, time_scale=1.0)
        kv = KVHandle("llm", PROMPT)
        task = asyncio.create_task(llm.run_one(Call("q", decode_node(100), {"kv": kv})))  # ~2.5 s of decoding
        await asyncio.sleep(0.06)  # virtual time: steps of 25 ms began at 0, 0.025 and 0.05
        steps = llm.stats.steps
        await llm.close()
        with pytest.raises(RuntimeError, match="closed"):
            await task
        idle = SimLLM(LLM, time_scale=0)
        await prefill(idle, PROMPT)
        before = idle.stats.steps
        await asyncio.sleep(0.02)  # event-driven: no step runs without work
        return steps, idle.stats.steps - before, await idle.close()

    steps, idle_steps, _ = run_virtual(main())
    assert steps == 3 and idle_steps == 0


def test_engine_serves_one_loop_after_another_and_zero_scale_is_instant() -> None:
    llm = SimLLM(LLM, time_scale=0)
    first = asyncio.run(generate(llm, PROMPT, 256))

    async def timed() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        text = await generate(llm, PROMPT, 256)
        return text, loop.time() - began

    second, elapsed = run_virtual(timed())  # another loop, whose clock moves only when something waits on a timer
    assert first == second and elapsed == 0.0  # 258 steps, and not one timed wait among them
    assert llm.stats.cache_hit_tokens == 32  # the cache outlives the event loop


class LateTimers(VirtualTimeLoop):
    """Virtual time whose timers fire `LATE_S` late, as epoll's whole-millisecond timeouts
    make a real loop's: the clock's lateness compensation, without the machine's noise."""

    LATE_S = 0.001

    def __init__(self) -> None:
        super().__init__()
        select = self._selector.select  # type: ignore[attr-defined]

        def late(timeout: float | None = None) -> Any:
            before = self.time()
            events = select(timeout)
            if self.time() > before:  # it waited for a timer: it wakes up late
                self._virtual_now += self.LATE_S
            return events

        self._selector.select = late  # type: ignore[attr-defined]


def test_short_steps_keep_their_profiled_pace() -> None:
    """At time_scale 0.01 a decode step is 0.25 ms, below the event loop's ~1 ms timer
    lateness; the clock carries the lateness over as a debt and sleeps that much less
    next time, so 100+ steps take their profiled time (less than one lateness more), not 5x."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        llm = SimLLM(LLM, time_scale=0.01)
        began = loop.time()
        await generate(llm, "p", 100)
        elapsed = loop.time() - began
        await llm.close()
        return elapsed, llm.stats.busy_s * 0.01

    with asyncio.Runner(loop_factory=LateTimers) as runner:
        elapsed, expected = runner.run(main())
    assert LateTimers.LATE_S < SimClock.MAX_DEBT_S  # the whole lateness is carried over
    assert expected - 1e-9 <= elapsed <= expected + LateTimers.LATE_S + 1e-9
