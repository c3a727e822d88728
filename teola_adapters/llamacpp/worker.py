"""The llama.cpp engine's worker thread: every llama.cpp call runs here, in `planner` order.

Calls come in as `Job`s. Each turn the worker takes the new ones, asks `planner.plan`
what to do, and does it: one chunk of a prefill, or one decode step (one `llama_decode`
for every decode of the step: continuous batching; a decode joins at the next step and
returns as soon as it is done). Prefills are resumable (`sequences.Chunks`), so a decode
of an earlier query never waits for a whole prompt of a later one.

    worker = Worker(seqs, prefill=..., generation=..., outputs=..., name="llm")
    future = worker.submit(Job(call, threading.Event(), cap=4))
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from teola_adapters._llm import DECODES
from teola_adapters.llamacpp.generation import Generation
from teola_adapters.llamacpp.planner import Plan, Rank, Work, cost_curve, costless_step_size, plan
from teola_adapters.llamacpp.sequences import Chunks, Sequences, Slot, drain
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind

_RANKED_QUERIES = 4096  # queries whose rank the worker remembers (the oldest are forgotten)


@dataclass(frozen=True)
class WorkDone:
    """What the worker just did, for a timeline: a prefill's chunk(s) or a decode step
    (`time.perf_counter` seconds; a step's calls are the decodes it advanced)."""

    kind: str  # "prefill" or "decode"
    began: float
    ended: float
    calls: tuple[Call, ...]


class WorkerError(RuntimeError):
    """The worker thread stopped (a bug, not a call's failure); every call handed in fails with it."""


@dataclass(eq=False)
class Job:
    """A call (or an engine task) handed to the worker thread."""

    call: Call | None
    cancel: threading.Event
    cap: int = 1  # a decode: the most sequences it may step with
    by_cost: bool = False  # a decode: its steps' size follows the measured step cost (`planner.step_size`)
    emit: Callable[[str], None] | None = None  # a streamed decode's deltas
    task: Callable[[], Any] | None = None
    future: Future[Any] = field(default_factory=Future)


@dataclass(eq=False)
class _Prefill:
    job: Job
    rank: Rank
    chunks: Chunks[Mapping[str, Any]]


@dataclass(eq=False)
class _Decode:
    job: Job
    rank: Rank
    gen: Generation
    slot: Slot | None = None  # the sequence it holds once admitted


class Worker:
    """Runs jobs on its own thread (see the module doc); `submit` from any thread."""

    def __init__(
        self,
        seqs: Sequences,
        *,
        prefill: Callable[[Call], Chunks[Mapping[str, Any]]],
        generation: Callable[[Job], Generation | None],
        outputs: Callable[[Call, str], Mapping[str, Any]],
        name: str,
        on_work: Callable[[WorkDone], None] | None = None,
    ) -> None:
        self.seqs = seqs
        self.stats = seqs.stats
        self._prefill_of = prefill
        self._generation_of = generation
        self._outputs = outputs
        self.name = name
        self._on_work = on_work
        self._jobs: deque[Job] = deque()
        self._prefills: list[_Prefill] = []
        self._begun: list[_Prefill] = []  # prefills between chunks, each holding a sequence
        self._decodes: list[_Decode] = []
        self._ranks: OrderedDict[str, tuple[float, int]] = OrderedDict()  # query id -> (arrival, first appearance)
        self._order = itertools.count()
        self.step_costs: dict[int, float] = {}  # seconds of a decode step by sequences (measured, refreshed)
        self._cost: Callable[[int], float] | None = None  # the step cost curve the last plan used
        self.steps_by_size: dict[int, int] = {}  # decode steps taken, by sequences stepped
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"teola-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future[Any]:
        with self._wake:
            if self._closed:
                raise WorkerError(f"{self.name} is closed")
            self._jobs.append(job)
            self._wake.notify()
        return job.future

    def close(self) -> None:
        """Finish the work handed in, then stop the thread (blocks until it has)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    # -- the thread ------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._jobs or self._prefills or self._begun or self._decodes)

    def _work(self) -> None:
        try:
            while True:
                with self._wake:
                    if not self._busy():
                        while not (self._busy() or self._closed):
                            self._wake.wait()
                    if self._closed and not self._busy():
                        return
                    jobs = list(self._jobs)
                    self._jobs.clear()
                for job in jobs:
                    self._take(job)
                self._drop_cancelled()
                self._do(self._plan())
        except BaseException as exc:  # a bug: fail everything handed in, take no more
            self._fail_all(WorkerError(f"{self.name}: the worker thread stopped: {exc!r}"))
            raise

    def _plan(self) -> Plan:
        prefills = [_prefill_work(p) for p in self._prefills]
        decodes = [Work(d.rank, d.job.cap, d.slot is not None, d, d.job.by_cost) for d in self._decodes]
        begun = [_prefill_work(p) for p in self._begun]
        reserve = 0 if begun else 1  # a sequence for the next prefill
        self._cost = cost_curve(self.step_costs) if self.step_costs else None
        size = self._step_size if self._cost is not None else None
        free = self.seqs.free()
        return plan(prefills, decodes, max(0, free - reserve), begun, size, may_start=free > 0)

    def _step_size(self, n: int, potential: int) -> int:
        """The mean-latency best step of n ready decodes where, by the measured curve, it costs
        nothing beyond stepping all `potential` together (the ready ones and those the waiting
        prefills prepare: what a server that batches every ready sequence gets); else all n."""
        assert self._cost is not None
        return costless_step_size(n, potential, self._cost)

    def _do(self, action: Plan) -> None:
        if action.prefill is not None:
            self._advance_prefill(action.prefill.item)
        elif action.step:
            self._step([w.item for w in action.step])

    def _rank(self, call: Call) -> Rank:
        """(query's arrival, its first appearance here, class, order): earliest query first,
        ties in the order queries came; a partial prefill goes after its query's other work
        (it prepares a later step: the decode the query waits for comes first). A call
        without an arrival (a direct caller's) counts as arriving when first seen here."""
        known = self._ranks.get(call.query_id)
        if known is None:
            arrival = call.arrival if call.arrival is not None else time.monotonic()
            known = self._ranks[call.query_id] = (arrival, next(self._order))
            if len(self._ranks) > _RANKED_QUERIES:
                self._ranks.popitem(last=False)
        return (*known, int(call.node.kind == PrimitiveKind.PARTIAL_PREFILL), next(self._order))

    def _take(self, job: Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # its caller is gone
        if job.task is not None:
            _settle(job, job.task)
            return
        call = job.call
        assert call is not None
        try:
            if call.node.kind not in DECODES:
                self._prefills.append(_Prefill(job, self._rank(call), self._prefill_of(call)))
                return
            gen = self._generation_of(job)
        except Exception as exc:  # this call fails alone
            job.future.set_exception(exc)
            return
        if gen is not None:
            self._decodes.append(_Decode(job, self._rank(call), gen))

    def _advance_prefill(self, prefill: _Prefill) -> None:
        if prefill in self._prefills:
            self._prefills.remove(prefill)
            self._begun.append(prefill)
        began = time.perf_counter()
        try:
            next(prefill.chunks)
            return  # more chunks to go
        except StopIteration as done:
            prefill.job.future.set_result(done.value)
        except Exception as exc:  # this call fails alone
            prefill.job.future.set_exception(exc)
        finally:
            self._report("prefill", began, (prefill.job,))
        self._begun.remove(prefill)

    def _drop_cancelled(self) -> None:
        for decode in [d for d in self._decodes if d.job.cancel.is_set()]:
            self._finish(decode)

    def _step(self, step: list[_Decode]) -> None:
        """Admit the step's waiting decodes, then one token for each, in one llama_decode."""
        began = time.perf_counter()
        going: list[_Decode] = []
        for decode in step:
            try:
                if decode.slot is None:
                    self._admit(decode)
                more = decode.gen.advance(self.seqs.llm)
            except Exception as exc:
                self._finish(decode, exc)
                continue
            if more:
                going.append(decode)
            else:
                self._finish(decode)
        if going:
            try:
                rows = self.seqs.llm.step([(d.slot.index, d.gen.token, d.gen.pos) for d in going])  # type: ignore[union-attr]
            except Exception as exc:
                for decode in going:
                    self._finish(decode, exc)
            else:
                for decode, logits in zip(going, rows, strict=True):
                    decode.gen.logits = logits
                    decode.gen.pos += 1
                self.stats.decode_steps += 1
                self._measured(len(going), time.perf_counter() - began)
        self.stats.decode_s += time.perf_counter() - began
        self._report("decode", began, [d.job for d in step])

    def _measured(self, n: int, seconds: float) -> None:
        """A step of `n` decodes took `seconds`: count it, and refresh the cost curve
        slowly (a moving average of weight 1/20: one step slowed by another process barely moves it)."""
        self.steps_by_size[n] = self.steps_by_size.get(n, 0) + 1
        if self._cost is not None:  # measured at start: keep it up to date
            known = self.step_costs.get(n)
            self.step_costs[n] = seconds if known is None else 0.95 * known + 0.05 * seconds

    def _report(self, kind: str, began: float, jobs: Sequence[Job]) -> None:
        if self._on_work is not None:
            calls = tuple(job.call for job in jobs if job.call is not None)
            self._on_work(WorkDone(kind, began, time.perf_counter(), calls))

    def _admit(self, decode: _Decode) -> None:
        """Bring the decode's prompt state into a free sequence, which it then holds."""
        slot = self.seqs.pick(decode.gen.tokens)
        decode.gen.logits = drain(self.seqs.ensure(slot, decode.gen.tokens))
        slot.busy = True
        decode.slot = slot
        self.stats.decodes += 1

    def _finish(self, decode: _Decode, error: Exception | None = None) -> None:
        self._decodes.remove(decode)
        if decode.slot is not None:
            self.seqs.release(decode.slot, failed=error is not None)
            self.stats.decode_tokens += decode.gen.generated
            self.seqs.cache.demote(decode.gen.tokens)
        if error is not None:
            decode.gen.close()
            decode.job.future.set_exception(error)
            return
        text = decode.gen.finish()
        call = decode.job.call
        assert call is not None
        _settle(decode.job, lambda: self._outputs(call, text))

    def _fail_all(self, error: WorkerError) -> None:
        with self._wake:
            self._closed = True
            jobs = [*self._jobs]
            self._jobs.clear()
        jobs += [w.job for w in (*self._prefills, *self._begun, *self._decodes)]
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)


def _prefill_work(prefill: _Prefill) -> Work:
    """A prefill as the planner sees it: a full prompt's, whose query's decode follows (`joins`),
    or a partial one's, which only prepares a prefix (`partial`)."""
    call = prefill.job.call
    joins = call is not None and call.node.kind != PrimitiveKind.PARTIAL_PREFILL
    return Work(prefill.rank, item=prefill, joins=joins, partial=not joins)


def _settle(job: Job, compute: Callable[[], Any]) -> None:
    try:
        result = compute()
    except Exception as exc:  # this call fails alone, as the protocol says
        job.future.set_exception(exc)
    else:
        job.future.set_result(result)
