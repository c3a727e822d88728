"""LocalRuntime: same outputs as the reference evaluator, cross-query batching, failures,
timeouts, cancellation, decode pipelining, hooks, and many queries at once.

The engines are small and deterministic; where a test needs an engine to wait, it waits
on an `asyncio.Event` the test controls, never on a sleep. The dispatch rate is a
benchmark (`PYTHONPATH=tests python tests/core/test_local_runtime.py`, `teola bench --overhead`),
not a test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from engine_watch import queued

from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits, EngineSet
from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.errors import GraphError, PrimitiveError, QueryCancelled
from teola_core.ir.graph import Graph
from teola_core.ir.kinds import MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.node import DecodePart
from teola_core.ir.speculation import SPECULATIVE, Speculation
from teola_core.ir.split_units import JsonArray, Lines, SplitUnit
from teola_core.ir.types import Document, KVHandle, PortType, Scored
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.runtime.base import PrimitiveSpan
from teola_core.runtime.local import LocalRuntime
from teola_core.runtime.reference import evaluate
from teola_core.scheduler.events import NodeFinished
from teola_core.scheduler.sizing import default_max_batch

K = PrimitiveKind


def _run(coro: Awaitable[Any], timeout: float = 10.0) -> Any:
    """Run a test coroutine; a hang fails the test instead of blocking the suite."""

    async def guarded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


def reply(prompt: str) -> str:
    return "\n".join(f"{prompt} #{i}" for i in range(3))


class Toy(Engine):
    """Embeds (upper-cases), reranks (score = length), prefills and decodes; records batches."""

    kinds = frozenset({K.EMBED, K.RERANK, K.PREFILL, K.DECODE, K.PARTIAL_DECODE})

    def __init__(self, name: str = "toy", limits: EngineLimits | None = None, chunk: int = 4) -> None:
        self.name = name
        self.limits = limits or EngineLimits()
        self.chunk = chunk
        self.batches: list[list[str]] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.batches.append([f"{c.query_id}:{c.node.id}" for c in calls])
        return [self.one(c) for c in calls]

    def one(self, c: Call) -> CallResult:
        if "boom" in repr(dict(c.inputs)):
            return ValueError(f"boom in {c.node.id}")
        if c.node.kind == K.EMBED:
            return {"vectors": [t.upper() for t in c.inputs["texts"]]}
        if c.node.kind == K.RERANK:
            return {"docs": [Scored(Document(d, d), float(len(d))) for d in c.inputs["docs"]]}
        if c.node.kind == K.PREFILL:
            return {"kv": KVHandle(self.name, c.inputs["prompt"])}
        if c.node.kind == K.DECODE:
            return {"text": reply(c.inputs["kv"].prompt)}
        return TypeError(f"toy cannot run {c.node.kind}")

    async def stream(self, call: Call) -> AsyncIterator[str]:
        text = reply(call.inputs["kv"].prompt)
        for i in range(0, len(text), self.chunk):
            yield text[i : i + self.chunk]


class Raising(Toy):
    """Its `run` raises: every call of the batch fails."""

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.batches.append([f"{c.query_id}:{c.node.id}" for c in calls])
        raise ConnectionError("engine is down")


class Gated(Toy):
    """Each batch waits for `gate`; `started` is set when a batch begins."""

    def __init__(self, name: str = "gated", limits: EngineLimits | None = None) -> None:
        super().__init__(name, limits)
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled: list[list[str]] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        names = [f"{c.query_id}:{c.node.id}" for c in calls]
        self.batches.append(names)
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(names)
            raise
        return [self.one(c) for c in calls]


class GatedStream(Toy):
    """Streams its first line, then waits for `gate` before the rest."""

    def __init__(self, name: str = "llm") -> None:
        super().__init__(name)
        self.gate = asyncio.Event()

    async def stream(self, call: Call) -> AsyncIterator[str]:
        first, rest = reply(call.inputs["kv"].prompt).split("\n", 1)
        yield first + "\n"
        await self.gate.wait()
        yield rest


# -- graphs --------------------------------------------------------------------------------
def staged_rag() -> Graph:
    """Stage-decomposed embedding (ItemSlice selects + concat) and rerank (topk), then an LLM."""
    b = GraphBuilder("staged_rag")
    question = b.input("question", PortType.TEXT)
    docs = b.input("docs", PortType.ANY)  # embedded as texts, reranked as documents
    vectors = b.aggregate([b.embed(docs[i : i + 2], engine="emb", items=2) for i in (0, 2, 4)], MergeMode.CONCAT)
    ranked = b.aggregate(
        [b.rerank(question, docs[i : i + 3], engine="emb", top_k=3) for i in (0, 3)], MergeMode.TOPK, top_k=3
    )
    context = b.call(lambda ranked: " ".join(s.doc.text for s in ranked), {"ranked": ranked}, inline=True)
    prompt = b.format("Q: {question} C: {context}", question=question, context=context)
    answer = b.llm(prompt, engine="llm", max_tokens=16)
    b.output(answer=answer.text, vectors=vectors, ranked=ranked)
    return b.build()


def embed_only(stages: int = 3) -> Graph:
    b = GraphBuilder("embed_only")
    docs = b.input("docs", PortType.TEXTS)
    parts = [b.embed(docs[2 * i : 2 * i + 2], engine="emb", items=2) for i in range(stages)]
    b.output(vectors=b.aggregate(parts, MergeMode.CONCAT))
    return b.build()


def branchy() -> Graph:
    b = GraphBuilder("branchy")
    x = b.input("x")
    cond = b.condition(x, lambda v: 0 if len(v) > 1 else 1, branches=2)
    with b.branch(cond, 0):
        up = b.embed(x, engine="emb")
        pos = b.call(lambda v: f"many {v}", {"v": up}, name="pos")
    with b.branch(cond, 1):
        neg = b.call(lambda v: f"one {v}", {"v": x}, name="neg", inline=True)
    b.output(v=b.aggregate([pos, neg], MergeMode.SELECT), x=x)
    return b.build()


def pipelined(unit: SplitUnit, count: int = 3, downstream: Callable[..., Any] | None = None) -> Graph:
    """A hand-built decode-pipelined graph: one partial-decode group of `count` nodes, each
    item chunk embedded on its own, joined by a concat aggregate; the last node has the text."""
    b = GraphBuilder("pipelined")
    q = b.input("q", PortType.TEXT)
    prompt = b.format("list for {q}", q=q)
    prefill = b.add(K.PREFILL, {"prompt": prompt}, engine="llm")
    chunks = []
    last = None
    for i in range(count):
        outputs = [PortSpec("items", PortType.ITEMS)]
        if i == count - 1:
            outputs.append(PortSpec("text", PortType.TEXT))
        node = b.add(
            K.PARTIAL_DECODE,
            {"kv": Value(prefill.id, "kv")},
            engine="llm",
            config={"split_unit": unit, "max_tokens": 64},
            part=DecodePart("answer", i, count),
            input_ports=(PortSpec("kv", PortType.KV),),
            output_ports=tuple(outputs),
            name=f"pd{i}",
        )
        items = Value(node.id, "items")
        if i == 0 and downstream is not None:
            items = b.call(downstream, {"items": items}, name="notice")
        chunks.append(b.embed(items, engine="emb"))
        last = node
    assert last is not None
    b.output(vectors=b.aggregate(chunks, MergeMode.CONCAT), text=Value(last.id, "text"))
    return b.build()


def engines(*extra: Engine) -> EngineSet:
    es = EngineSet()
    names = {e.name for e in extra}
    for e in extra:
        es.add(e)
    for name in ("emb", "llm"):
        if name not in names:
            es.add(Toy(name))
    return es


# -- same outputs as the reference ---------------------------------------------------------
@pytest.mark.parametrize(
    ("graph", "inputs"),
    [
        (staged_rag(), {"question": "why", "docs": ["a", "bbb", "cc", "dddd", "e", "ffffff"]}),
        (embed_only(), {"docs": list("abcdef")}),
        (branchy(), {"x": ["a", "b"]}),
        (branchy(), {"x": ["a"]}),
        (pipelined(Lines()), {"q": "fruit"}),
        (pipelined(Lines(), count=5), {"q": "fruit"}),  # more nodes than items: empty chunks
        (pipelined(Lines(), count=1), {"q": "fruit"}),
    ],
    ids=["staged_rag", "embed_only", "branch0", "branch1", "pipelined", "pipelined_short", "pipelined_one"],
)
def test_outputs_equal_the_reference_evaluator(graph: Graph, inputs: dict[str, Any]) -> None:
    async def main() -> None:
        es = engines()
        expected = await evaluate(graph, inputs, es)
        rt = LocalRuntime(engines())
        try:
            assert await rt.run(graph, inputs) == expected
        finally:
            await rt.close()

    _run(main())


def test_json_array_partial_decode_matches_the_reference() -> None:
    class JsonLLM(Toy):
        async def stream(self, call: Call) -> AsyncIterator[str]:
            for delta in ('["al', 'pha", "be', 'ta",', ' "gamma"', "]"):
                yield delta

    async def main() -> None:
        g = pipelined(JsonArray())
        expected = await evaluate(g, {"q": "x"}, engines(JsonLLM("llm")))
        rt = LocalRuntime(engines(JsonLLM("llm")))
        assert await rt.run(g, {"q": "x"}) == expected
        assert expected["vectors"] == ["ALPHA", "BETA", "GAMMA"]
        await rt.close()

    _run(main())


def test_many_concurrent_queries_each_get_their_own_outputs() -> None:
    async def main() -> None:
        g = staged_rag()
        es = engines()
        rt = LocalRuntime(es)
        queries = [{"question": f"q{i}", "docs": [f"d{i}{j}" * (j + 1) for j in range(6)]} for i in range(12)]
        got = await asyncio.gather(*(rt.run(g, q) for q in queries))
        for q, out in zip(queries, got, strict=True):
            assert out == await evaluate(g, q, engines())
        await rt.close()

    _run(main())


# -- batching ------------------------------------------------------------------------------
def test_cross_query_batching_shows_in_batch_sizes() -> None:
    async def main() -> None:
        emb = Toy("emb", EngineLimits(max_batch_items=16))
        rt = LocalRuntime(engines(emb))
        g = embed_only()
        await asyncio.gather(*(rt.run(g, {"docs": list("abcdef")}, query_id=f"q{i}") for i in range(6)))
        await rt.close()
        return emb.batches

    batches = _run(main())
    # All six queries are submitted in one loop turn, so their 18 stages (2 items each)
    # meet in the engine queue: topology order (earliest query first), 16 items a batch.
    q = [[f"q{i}:embed", f"q{i}:embed#1", f"q{i}:embed#2"] for i in range(6)]
    assert batches == [
        q[0] + q[1] + q[2][:2],
        q[2][2:] + q[3] + q[4] + q[5][:1],
        q[5][1:],
    ]


def test_policy_and_max_batch_overrides_reach_the_engine_schedulers() -> None:
    emb = Toy("emb", EngineLimits(max_batch_items=8))
    emb.profile = LatencyProfile("emb", {"embed": Curve(((1, 0.1), (4, 0.15), (16, 0.45), (32, 0.9)))})
    assert default_max_batch(emb) == 8  # the profile says 16; the engine's hard limit says 8
    emb.limits = EngineLimits()
    assert default_max_batch(emb) == 16
    assert default_max_batch(Toy("plain")) is None
    assert default_max_batch(Toy("lim", EngineLimits(max_batch_items=3))) == 3
    rt = LocalRuntime(engines(emb), policy="po", max_batch={"llm": 2})
    assert rt.scheduler("emb").max_batch_items == 16 and rt.scheduler("emb").policy.name == "po"
    assert rt.scheduler("llm").max_batch_items == 2
    rt = LocalRuntime(engines(), policy="to", to_max_batch=5)
    assert rt.scheduler("emb").policy.limit(None) == 5
    with pytest.raises(ValueError, match="unknown scheduling policy 'best'"):
        LocalRuntime(engines(), policy="best")
    with pytest.raises(ValueError, match=r"unknown engine\(s\) \['nope'\]"):
        LocalRuntime(engines(), max_batch={"nope": 1})


# -- failures ------------------------------------------------------------------------------
def test_a_failing_call_fails_only_its_query_naming_the_primitive() -> None:
    async def main() -> None:
        emb = Toy("emb")
        rt = LocalRuntime(engines(emb))
        g = embed_only(stages=1)
        results = await asyncio.gather(
            *(rt.run(g, {"docs": docs}) for docs in (["a", "b"], ["boom"], ["c"])), return_exceptions=True
        )
        await rt.close()
        return emb.batches, results

    batches, (ok1, failed, ok2) = _run(main())
    assert batches == [["q0:embed", "q1:embed", "q2:embed"]]  # one batch, one failure in it
    assert ok1 == {"vectors": ["A", "B"]} and ok2 == {"vectors": ["C"]}
    assert isinstance(failed, PrimitiveError) and isinstance(failed.__cause__, ValueError)
    assert str(failed) == "query q1: primitive embed (embed on emb) failed: ValueError: boom in embed"


def test_an_engine_that_raises_fails_every_call_of_its_batch() -> None:
    async def main() -> list[Any]:
        rt = LocalRuntime(engines(Raising("emb")))
        g = embed_only(stages=1)
        results = await asyncio.gather(*(rt.run(g, {"docs": [str(i)]}) for i in range(3)), return_exceptions=True)
        await rt.close()
        return results

    results = _run(main())
    assert all(isinstance(r, PrimitiveError) and isinstance(r.error, ConnectionError) for r in results)
    assert [r.query_id for r in results] == ["q0", "q1", "q2"]


def test_a_batch_past_the_engine_timeout_fails_with_a_named_timeout_error() -> None:
    async def main() -> None:
        gated = Gated("emb", EngineLimits(timeout_s=0.05))
        rt = LocalRuntime(engines(gated))
        with pytest.raises(PrimitiveError, match=r"embed \(embed on emb\) failed: TimeoutError") as info:
            await rt.run(embed_only(stages=1), {"docs": ["a"]})
        assert isinstance(info.value.error, TimeoutError)
        assert str(info.value.error) == (
            "step embed (embed on emb) ran past its 0.05 s timeout on engine 'emb' "
            "(the engine's EngineLimits.timeout_s)"
        )
        assert gated.cancelled == [["q0:embed"]]
        # The slot is free again: the next query runs once the gate opens.
        gated.gate.set()
        assert await rt.run(embed_only(stages=1), {"docs": ["b"]}) == {"vectors": ["B"]}
        await rt.close()

    _run(main())


def test_user_and_inline_failures_and_missing_inputs_are_named() -> None:
    async def main() -> None:
        rt = LocalRuntime(engines())
        b = GraphBuilder("fails")
        x = b.input("x")
        b.output(v=b.call(lambda x: 1 / x, {"x": x}, name="divide"))
        with pytest.raises(PrimitiveError, match=r"primitive divide \(call\) failed: ZeroDivisionError"):
            await rt.run(b.build(), {"x": 0})
        # A select aggregate that gets both of its parts is an error (ops.aggregate).
        b = GraphBuilder("select")
        x = b.input("x")
        b.output(v=b.aggregate([x, x], MergeMode.SELECT))
        with pytest.raises(PrimitiveError, match=r"aggregate \(aggregate\) failed: ValueError"):
            await rt.run(b.build(), {"x": 1})
        with pytest.raises(GraphError, match="query input 'x' is missing"):
            await rt.run(b.build(), {})
        await rt.close()

    _run(main())


def test_an_unknown_engine_fails_the_query_naming_it() -> None:
    async def main() -> None:
        b = GraphBuilder("lost")
        docs = b.input("docs", PortType.TEXTS)
        b.output(v=b.embed(docs, engine="nowhere"))
        rt = LocalRuntime(engines())
        with pytest.raises(PrimitiveError, match=r"no engine named 'nowhere' \(registered: emb, llm\)"):
            await rt.run(b.build(), {"docs": ["a"]})
        await rt.close()

    _run(main())


def test_an_error_in_the_scheduler_fails_the_query_instead_of_hanging() -> None:
    async def main() -> None:
        rt = LocalRuntime(engines())
        handle = rt._graph.handle

        def broken(event: Any) -> Any:
            if isinstance(event, NodeFinished) and event.query_id == "bad":
                raise RuntimeError("scheduler bug")
            return handle(event)

        rt._graph.handle = broken  # type: ignore[method-assign]
        g = embed_only(stages=1)
        bad, good = await asyncio.gather(
            rt.run(g, {"docs": ["a"]}, query_id="bad"),
            rt.run(g, {"docs": ["b"]}, query_id="good"),
            return_exceptions=True,
        )
        assert isinstance(bad, RuntimeError) and str(bad) == "scheduler bug"
        assert good == {"vectors": ["B"]}
        assert "bad" not in rt._graph
        await rt.close()

    _run(main())


def test_a_failing_hook_is_reported_and_does_not_stop_the_query() -> None:
    class Broken:
        def on_span(self, span: PrimitiveSpan) -> None:
            raise RuntimeError("hook bug")

    async def main() -> None:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        rt = LocalRuntime(engines())
        rt.add_hook(Broken())
        assert await rt.run(embed_only(stages=1), {"docs": ["a"]}) == {"vectors": ["A"]}
        assert reported and isinstance(reported[0]["exception"], RuntimeError)
        await rt.close()

    _run(main())


# -- cancellation and close ----------------------------------------------------------------
def test_cancelling_a_caller_cancels_its_query_and_the_others_finish() -> None:
    async def main() -> None:
        gated = Gated("emb", EngineLimits(max_batch_items=1))
        rt = LocalRuntime(engines(gated))
        g = embed_only(stages=1)
        a = asyncio.create_task(rt.run(g, {"docs": ["a"]}, query_id="A"))
        await gated.started.wait()  # A's batch is running; B and C will queue behind it
        both_queued = queued(rt, "emb", 2)
        b = asyncio.create_task(rt.run(g, {"docs": ["b"]}, query_id="B"))
        c = asyncio.create_task(rt.run(g, {"docs": ["c"]}, query_id="C"))
        await both_queued.wait()  # the engine scheduler holds B and C
        assert rt.scheduler("emb").pending == 2
        gated.started.clear()
        b.cancel()  # pending: dropped from the engine queue
        a.cancel()  # running, and only A needs that batch: the batch is cancelled
        for t in (a, b):
            with pytest.raises(asyncio.CancelledError):
                await t
        await gated.started.wait()  # C's batch started on the freed slot
        gated.gate.set()
        assert await c == {"vectors": ["C"]}
        assert gated.batches == [["A:embed"], ["C:embed"]]
        assert gated.cancelled == [["A:embed"]]
        assert rt._queries == {} and rt._graph.queries == () and rt.scheduler("emb").pending == 0
        await rt.close()

    _run(main())


def test_close_fails_running_queries_and_cancels_background_tasks() -> None:
    async def main() -> None:
        gated = Gated("emb")
        rt = LocalRuntime(engines(gated))
        task = asyncio.create_task(rt.run(embed_only(stages=1), {"docs": ["a"]}))
        await gated.started.wait()
        await rt.close()
        with pytest.raises(QueryCancelled, match="runtime was closed"):
            await task
        assert gated.cancelled == [["q0:embed"]]
        assert rt._tasks == set()
        with pytest.raises(RuntimeError, match="closed"):
            await rt.run(embed_only(), {"docs": []})

    _run(main())


def test_a_query_id_cannot_run_twice_at_once() -> None:
    async def main() -> None:
        gated = Gated("emb")
        rt = LocalRuntime(engines(gated))
        task = asyncio.create_task(rt.run(embed_only(stages=1), {"docs": ["a"]}, query_id="same"))
        await gated.started.wait()
        with pytest.raises(ValueError, match="'same' is already running"):
            await rt.run(embed_only(stages=1), {"docs": ["a"]}, query_id="same")
        gated.gate.set()
        assert await task == {"vectors": ["A"]}
        await rt.close()

    _run(main())


def guessing(engine_started: asyncio.Event | None = None) -> Graph:
    """A speculative embed ("guess") and a count ("known", after `engine_started` when given),
    joined: the join may go on without the guess (its withdrawn value is an empty tuple)."""

    async def count(docs: list[str]) -> int:
        if engine_started is not None:
            await engine_started.wait()
        return len(docs)

    b = GraphBuilder("guessing")
    docs = b.input("docs", PortType.TEXTS)
    speculation = Speculation("join", {"vectors": ()})
    node = b.add(K.EMBED, {"texts": docs}, engine="emb", name="guess", config={SPECULATIVE: speculation})
    known = b.call(count, {"docs": docs}, name="known")
    joined = b.call(lambda n, v: (n, list(v)), {"n": known, "v": Value(node.id, "vectors")}, name="join", inline=True)
    b.output(value=joined)
    return b.build()


def test_a_guess_waits_for_idle_engine_time_and_is_given_up_when_the_rest_is_ready() -> None:
    async def main() -> None:
        gated = Gated("emb")
        rt = LocalRuntime(engines(gated))
        busy = asyncio.create_task(rt.run(embed_only(stages=1), {"docs": ["a"]}, query_id="busy"))
        await gated.started.wait()
        # The engine is busy: the guess waits for it, and the join stops waiting for the guess.
        assert await rt.run(guessing(), {"docs": ["x", "y"]}, query_id="given up") == {"value": (2, [])}
        gated.gate.set()
        assert await busy == {"vectors": ["A"]}
        gated.started.clear()  # idle now: the guess starts, and once started it is used
        idle = guessing(engine_started=gated.started)
        assert await rt.run(idle, {"docs": ["x"]}, query_id="idle") == {"value": (1, ["X"])}
        assert gated.batches == [["busy:embed"], ["idle:guess"]]  # the given-up guess never ran
        await rt.close()

    _run(main())


# -- decode pipelining ---------------------------------------------------------------------
def test_partial_decode_items_flow_downstream_while_the_stream_runs() -> None:
    async def main() -> None:
        llm = GatedStream("llm")

        async def notice(items: list[str]) -> list[str]:
            llm.gate.set()  # the stream may only finish after item 0 went downstream
            return items

        g = pipelined(Lines(), downstream=notice)
        spans: list[PrimitiveSpan] = []
        rt = LocalRuntime(engines(llm))
        rt.add_hook(type("Hook", (), {"on_span": lambda self, s: spans.append(s)})())
        got = await rt.run(g, {"q": "fruit"})
        await rt.close()

        ref_llm = GatedStream("llm")
        ref_llm.gate.set()
        assert got == await evaluate(g, {"q": "fruit"}, engines(ref_llm))
        ended = {s.node.id: s.ended_at for s in spans}
        assert ended["pd0"] <= ended["notice"] <= ended["pd2"]

    _run(main())


def test_a_failing_stream_fails_the_query() -> None:
    class Broken(Toy):
        async def stream(self, call: Call) -> AsyncIterator[str]:
            yield "one\n"
            raise ConnectionError("stream lost")

    async def main() -> None:
        rt = LocalRuntime(engines(Broken("llm")))
        with pytest.raises(PrimitiveError, match=r"partial_decode on llm.*ConnectionError: stream lost"):
            await rt.run(pipelined(Lines()), {"q": "x"})

        # A truncated JSON array fails at the parser's close, as the reference does.
        class Truncated(Toy):
            async def stream(self, call: Call) -> AsyncIterator[str]:
                yield '["a", "b"'

        rt2 = LocalRuntime(engines(Truncated("llm")))
        with pytest.raises(PrimitiveError, match=r"partial_decode on llm.*JSONDecodeError"):
            await rt2.run(pipelined(JsonArray()), {"q": "x"})
        await rt.close()
        await rt2.close()

    _run(main())


# -- hooks ---------------------------------------------------------------------------------
def test_hooks_get_one_span_per_dispatched_primitive() -> None:
    async def main() -> list[PrimitiveSpan]:
        spans: list[PrimitiveSpan] = []

        class Collect:
            def on_span(self, span: PrimitiveSpan) -> None:
                spans.append(span)

        rt = LocalRuntime(engines())
        rt.add_hook(Collect())
        g = embed_only(stages=2)
        await asyncio.gather(*(rt.run(g, {"docs": list("abcd")}) for _ in range(2)))
        await asyncio.gather(rt.run(g, {"docs": ["boom"]}), return_exceptions=True)
        await rt.close()
        return spans

    spans = _run(main())
    ok = [s for s in spans if s.query_id in ("q0", "q1")]
    assert sorted((s.query_id, s.node.id) for s in ok) == sorted(
        (q, n) for q in ("q0", "q1") for n in ("embed", "embed#1", "aggregate")
    )
    assert all(s.ready_at <= s.started_at <= s.ended_at for s in spans)
    assert {s.batch_size for s in ok if s.node.kind == K.EMBED} == {4}  # both queries, both stages
    failed = [s for s in spans if s.error]
    assert failed and failed[0].query_id == "q2" and failed[0].error.startswith("ValueError: boom")


# -- many queries at once -----------------------------------------------------------------
class Zero(Engine):
    """A zero-latency engine (the runtime's own work is all there is); records its batch sizes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[int] = []

    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        self.batches.append(len(calls))
        out: list[CallResult] = []
        for c in calls:
            kind = c.node.kind
            if kind == K.EMBED:
                out.append({"vectors": c.inputs["texts"]})
            elif kind == K.PREFILL:
                out.append({"kv": c.inputs["prompt"]})
            else:
                out.append({"text": "ok"})
        return out


def rate_graph() -> Graph:
    """9 dispatched primitives: 4 embed stages, a concat, a format, 2 prefill+decode pairs."""
    b = GraphBuilder("rate")
    q = b.input("q", PortType.TEXT)
    docs = b.input("docs", PortType.TEXTS)
    vectors = b.aggregate([b.embed(docs[i : i + 1], engine="emb", items=1) for i in range(4)], MergeMode.CONCAT)
    prompt = b.format("{q} {v}", q=q, v=vectors)
    first = b.llm(prompt, engine="llm", max_tokens=1, name="first")
    b.output(a=first.text)
    return b.build()


RATE_INPUTS = {"q": "hi", "docs": list("abcd")}


async def run_at_once(rt: LocalRuntime, queries: int, fresh_graphs: bool) -> list[dict[str, Any]]:
    """`queries` queries submitted at once, each on a graph of its own or all on one graph."""
    graphs = [rate_graph() for _ in range(queries)] if fresh_graphs else [rate_graph()] * queries
    return list(await asyncio.gather(*(rt.run(g, RATE_INPUTS) for g in graphs)))


def test_hundreds_of_queries_at_once_all_answer_and_fill_the_batches() -> None:
    """400 queries on zero-latency engines, on fresh graphs and on one shared graph object:
    every query answers, every primitive runs exactly once, and the queries' calls share
    batches up to the max batch (the dispatch rate itself is a benchmark: see the end)."""

    async def main(fresh_graphs: bool) -> tuple[list[dict[str, Any]], list[int], list[int]]:
        emb, llm = Zero("emb"), Zero("llm")
        rt = LocalRuntime(EngineSet().add(emb).add(llm), max_batch={"emb": 16, "llm": 16})
        results = await run_at_once(rt, 400, fresh_graphs)
        await rt.close()
        return results, emb.batches, llm.batches

    for fresh_graphs in (True, False):
        results, emb, llm = asyncio.run(main(fresh_graphs))
        assert results == [{"a": "ok"}] * 400
        assert sum(emb) == 4 * 400 and sum(llm) == 2 * 400  # 4 embed stages, a prefill and a decode each
        assert max(emb) == 16 and 1 < max(llm) <= 16  # calls of different queries share batches, up to the max


if __name__ == "__main__":  # PYTHONPATH=tests python tests/core/test_local_runtime.py: the micro benchmark
    import time

    def dispatch_rate(queries: int, fresh_graphs: bool) -> float:
        per_query = sum(1 for n in rate_graph().nodes.values() if n.kind not in (K.INPUT, K.OUTPUT))

        async def main() -> float:
            rt = LocalRuntime(EngineSet().add(Zero("emb")).add(Zero("llm")), max_batch={"emb": 16, "llm": 16})
            await rt.run(rate_graph(), RATE_INPUTS, query_id="warmup")
            began = time.perf_counter()
            await run_at_once(rt, queries, fresh_graphs)
            elapsed = time.perf_counter() - began
            await rt.close()
            return per_query * queries / elapsed

        return asyncio.run(main())

    for fresh_graphs in (True, False):
        label = "a graph per query" if fresh_graphs else "one shared graph"
        print(f"{dispatch_rate(2000, fresh_graphs):,.0f} primitive dispatches/s ({label})")


def test_engines_see_each_call_with_its_querys_arrival() -> None:
    """An engine that orders work itself (llama.cpp's) serves earlier queries first: every call
    carries its query's arrival, and a nested query given its parent's arrival keeps it."""
    seen: list[tuple[str, float | None]] = []

    class Recording(Engine):
        name = "rec"
        limits = EngineLimits(max_batch_items=4)

        async def run(self, calls: Sequence[Call]) -> list[CallResult]:
            seen.extend((c.query_id, c.arrival) for c in calls)
            return [{"vectors": [[1.0]]} for _ in calls]

    b = GraphBuilder("g")
    b.output(out=b.embed(b.input("texts"), engine="rec"))
    graph = b.build()

    async def main() -> None:
        runtime = LocalRuntime(EngineSet().add(Recording()))
        await runtime.run(graph, {"texts": ["a"]}, query_id="q1", arrival=5.0)
        await runtime.run(graph, {"texts": ["b"]}, query_id="q1/nested", arrival=5.0)
        await runtime.run(graph, {"texts": ["c"]}, query_id="q2")
        await runtime.close()

    asyncio.run(main())
    assert seen[:2] == [("q1", 5.0), ("q1/nested", 5.0)]
    assert seen[2][0] == "q2" and isinstance(seen[2][1], float)  # arrived now, on the runtime's clock
