"""When a chain gets a new plan: its calls teach run times, and a plan made with them may differ.

Every call — on the graph or as LangChain runs it — reports each step's run time, the
items list parsers produce, and the engines' batch times (`learning.py`). After
`learn_after` calls, and whenever those figures change materially, the chain is traced
and optimized again with them (`plans.Planner`; given profiles win over learned ones),
so a chain that started as LangChain runs it moves to the graph once a pass is seen to
pay. A call runs on the plan it started with; a plan never changes a result.

    replanner = Replanner(planner, LatencyBook(), learn_after=3, profiles_path=None, name="chain")
    with replanner.calling(asynchronous=False) as plan:
        ...  # run the call on `plan`; a new plan may be made when it ends

Observing costs every run a little (a callback handler), so once the first learned plan
is made only one call in `OBSERVE_EVERY` is timed, fewer while observations change no plan.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from teola_core.profiles.learning import LatencyBook, differs, words_differ
from teola_langchain.planning.learning import AsyncObserver, Observer, observing
from teola_langchain.planning.plans import Plan, Planner

log = logging.getLogger("teola.langchain")

LEARN_AFTER = 3  # calls before the first plan with learned figures
MIN_SAMPLES = 3  # observations of a step before its median is used
OBSERVE_EVERY = 4  # once learned, one call in this many is timed ...
OBSERVE_EVERY_MAX = 64  # ... doubling up to this while what is observed changes no plan


class Replanner:
    """The chain's current plan, and a new one when what its calls teach changes it.

    learned: what the calls taught; learn_after: calls before the first learned plan (0:
    never learn); profiles_path: the JSON file what was learned is written to at each new
    plan; first: the plan made at optimize(); current: the plan new calls run on;
    not_learning: why this chain does not learn (None while it does).
    """

    def __init__(
        self,
        planner: Planner,
        learned: LatencyBook,
        *,
        learn_after: int,
        profiles_path: Path | None,
        name: str,
        warn: bool = False,
    ) -> None:
        self.planner = planner
        self.learned = learned
        self.learn_after = learn_after
        self.profiles_path = profiles_path
        self.name = name
        self.not_learning: str | None = "learn_after=0" if learn_after <= 0 else None
        self.current = self.first = self._make_plan(warn=warn)
        if self.learning and not self.current.traced.uses_engines:
            self.not_learning = "no step runs on an engine: only engine calls' latencies can change a plan"
        self.clock = time.perf_counter  # what observations are timed with (tests give a virtual clock)
        self._replanning = threading.Lock()
        self._started = itertools.count()  # calls started (which are observed: `_observed`)
        self._observe_every = OBSERVE_EVERY
        self._looked_at = -1  # the book's version at the last look for a new plan

    @property
    def learning(self) -> bool:
        return self.not_learning is None

    def _make_plan(self, *, warn: bool = False) -> Plan:
        """A plan with what was learned so far (nothing when not learning)."""
        if not self.learning:
            return self.planner.plan({}, {}, {}, self.learned.calls, warn=warn)
        book = self.learned
        return self.planner.plan(
            book.profiles(MIN_SAMPLES), book.counts(MIN_SAMPLES), book.words(MIN_SAMPLES), book.calls, warn=warn
        )

    @contextmanager
    def calling(self, *, asynchronous: bool) -> Iterator[Plan]:
        """One call: the plan it runs on (the current one, kept to its end), timed when due
        (`_observed`), then a look at whether a new plan is due (`call_done`)."""
        plan = self.current
        try:
            with self._observed(asynchronous):
                yield plan
        finally:
            self.call_done()

    def call_done(self) -> None:
        """A call finished: re-plan when due (see the module docstring). Never raises into the call."""
        calls = self.learned.call_done()
        if not self.learning or calls < self.learn_after or not self._replanning.acquire(blocking=False):
            return
        try:
            if self.learned.version == self._looked_at:
                return
            self._looked_at = self.learned.version
            plan = self.current
            learned, counts = self.learned.profiles(MIN_SAMPLES), self.learned.counts(MIN_SAMPLES)
            words = self.learned.words(MIN_SAMPLES)
            if differs(plan.learned, learned) or plan.counts != counts or words_differ(plan.words, words):
                self.current = self._make_plan()
                self._observe_every = OBSERVE_EVERY
                if self.profiles_path is not None:
                    self.learned.save(self.profiles_path)
            else:
                self._observe_every = min(2 * self._observe_every, OBSERVE_EVERY_MAX)
        except Exception as exc:  # the call itself succeeded or failed on its own: learning stops, loudly
            self.not_learning = f"re-planning failed ({type(exc).__name__}: {exc})"
            log.exception("teola: %s stops learning (its current plan stays); the error was", self.name)
        finally:
            self._replanning.release()

    def _observed(self, asynchronous: bool) -> AbstractContextManager[None]:
        """Where this call's runs are timed (see `learning.py`): every call until the first learned
        plan, then one in `OBSERVE_EVERY`, fewer while observations change no plan (a callback
        handler costs every run a little); none when not learning."""
        started = next(self._started)
        if not self.learning or (started >= self.learn_after and started % self._observe_every):
            return nullcontext()
        return observing((AsyncObserver if asynchronous else Observer)(self.learned, self.clock))

    def save(self, path: str | Path | None = None) -> Path:
        """Write what was learned (to `path`, or the `profiles=` file)."""
        target = Path(path) if path is not None else self.profiles_path
        if target is None:
            raise ValueError("save_profiles(): give a path (this runnable was not given profiles='file.json')")
        self.learned.save(target)
        return target
