"""One object per event loop, made on first use there.

Runtimes, admissions and agent runtimes hold loop-bound futures and queues, so an
optimized object called from several loops (the caller's, its own sync thread's, a
server's) keeps one of each per loop. Loops are held weakly: a loop that is collected
takes its object with it.

    runtimes: PerLoop[LocalRuntime] = PerLoop()
    runtime = runtimes.current(lambda: LocalRuntime(engines))   # on a running loop
    runtimes.apply_to_all(lambda r: r.add_hook(hook))          # the ones made so far and later

The maker is given at each use rather than kept, so an owner passing its own bound
method makes no reference cycle (owners close things in `weakref.finalize`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None: `asyncio.get_running_loop` without the raise."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class PerLoop(Generic[T]):
    """Objects by event loop, made on first use (see the module docstring)."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()
        self._setups: list[Callable[[T], None]] = []
        self._lock = threading.Lock()

    def current(self, make: Callable[[], T]) -> T:
        """The running loop's object (must be called on a running loop)."""
        return self.get(asyncio.get_running_loop(), make)

    def get(self, loop: asyncio.AbstractEventLoop, make: Callable[[], T]) -> T:
        """`loop`'s object, made now by `make` if it has none yet."""
        with self._lock:
            value = self._by_loop.get(loop)
            if value is None:
                value = self._by_loop[loop] = make()
                for setup in self._setups:
                    setup(value)
            return value

    def apply_to_all(self, setup: Callable[[T], None]) -> None:
        """Call `setup` on every object made so far, and on each one made later."""
        with self._lock:
            self._setups.append(setup)
            for value in self._by_loop.values():
                setup(value)

    def values(self) -> list[T]:
        """The objects made so far, on every loop."""
        with self._lock:
            return list(self._by_loop.values())

    def pop_current(self) -> T | None:
        """Forget the running loop's object and return it (None if it had none), to close it."""
        with self._lock:
            return self._by_loop.pop(asyncio.get_running_loop(), None)

    def clear(self) -> None:
        """Forget every object (the next use on each loop makes a fresh one)."""
        with self._lock:
            self._by_loop.clear()
