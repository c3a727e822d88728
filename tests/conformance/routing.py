"""Shared by the `route_*` pytest plugins: patch top-level calls, record their results.

`route(classes, methods, optimize)` replaces each method of each class with a wrapper:
outside Teola, a call goes to `optimize(obj)`'s method of the same name (mode "route")
or to the original (mode "record"); inside a call already routed (nested steps, or
Teola's own execution, which may be an instance of the routed class, as an optimized
LangGraph graph is) it takes the original. Either way the call's result (or error, or
stream chunks) is appended, normalized, to the JSONL file `$TEOLA_CONFORMANCE_RECORDS`
at the end of the session, so `run.py` can compare routed results with plain ones. A
wrapper marks itself `__teola_transparent__` (it computes nothing the original does
not), so Teola still treats the routed classes as LangChain's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import os
import re
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

MODE = os.environ.get("TEOLA_CONFORMANCE_MODE", "route")
RECORDS = os.environ.get("TEOLA_CONFORMANCE_RECORDS")
OPTIONS: dict[str, Any] = json.loads(os.environ.get("TEOLA_CONFORMANCE_OPTIONS") or "{}")  # for teola.optimize

_inside = contextvars.ContextVar("teola_conformance_inside", default=False)
_current_test: list[str] = [""]
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def set_current_test(nodeid: str) -> None:
    _current_test[0] = nodeid


def normalize(value: Any) -> str:
    """A comparable text for a result: addresses and UUIDs masked, bounded length."""
    text = f"raised {type(value).__name__}: {value}" if isinstance(value, BaseException) else repr(value)
    return _UUID.sub("<uuid>", _ADDRESS.sub("0x?", text))[:4000]


_recorded: list[dict[str, Any]] = []


def _record(method: str, owner: str, result: Any, teola: bool) -> None:
    """Kept in memory (the suites forbid blocking I/O on an event loop); written by `flush`."""
    test = _current_test[0]
    _recorded.append({"test": test, "method": f"{owner}.{method}", "result": normalize(result), "teola": teola})


def flush() -> None:
    """Write the recorded calls to `$TEOLA_CONFORMANCE_RECORDS` (at the end of the session)."""
    if RECORDS is not None:
        with open(RECORDS, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in _recorded)


def route(classes: Iterable[type], methods: Iterable[str], optimize: Callable[[Any], Any]) -> None:
    """Patch `methods` of `classes` (see the module docstring)."""
    for cls in classes:
        for name in methods:
            original = getattr(cls, name, None)
            if original is not None:
                wrapper = _wrap(cls.__name__, name, original, optimize)
                wrapper.__teola_transparent__ = original  # see teola_langchain.components.patched
                setattr(cls, name, wrapper)


def _target(self: Any, name: str, original: Any, optimize: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(the object whose method runs, the callable) for a top-level call."""
    if MODE != "route":
        return None, functools.partial(original, self)
    token = _inside.set(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = optimize(self, **OPTIONS)
    finally:
        _inside.reset(token)
    # The class's method: an instance attribute of that name is a user's patch that called us
    # (copied onto a drop-in made as a copy of the object, it would call us again).
    return fast, functools.partial(getattr(type(fast), name), fast)


def _ran_on_teola(fast: Any) -> bool:
    return fast is not None and getattr(fast, "calls_on_graph", 0) > 0


def _wrap(owner: str, name: str, original: Any, optimize: Callable[[Any], Any]) -> Any:
    inside_routed = True  # what nested calls see during a top-level call: the original

    async def guarded_aiter(stream: Any, fast: Any) -> Any:
        """Iterate a top-level call's stream with the guard set per step (steps may run in
        different contexts: tasks), record its chunks, close it with the caller."""
        chunks: list[Any] = []
        try:
            while True:
                token = _inside.set(inside_routed)
                try:
                    x = await stream.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    _inside.reset(token)
                chunks.append(x)
                yield x
        except BaseException as exc:
            _record(name, owner, exc, _ran_on_teola(fast))
            raise
        finally:
            token = _inside.set(inside_routed)
            try:
                await stream.aclose()
            finally:
                _inside.reset(token)
        _record(name, owner, chunks, _ran_on_teola(fast))

    def guarded_iter(stream: Any, fast: Any) -> Any:
        """`guarded_aiter` for a sync stream."""
        chunks: list[Any] = []
        try:
            while True:
                token = _inside.set(inside_routed)
                try:
                    x = next(stream)
                except StopIteration:
                    break
                finally:
                    _inside.reset(token)
                chunks.append(x)
                yield x
        except BaseException as exc:
            _record(name, owner, exc, _ran_on_teola(fast))
            raise
        finally:
            token = _inside.set(inside_routed)
            try:
                stream.close()
            finally:
                _inside.reset(token)
        _record(name, owner, chunks, _ran_on_teola(fast))

    if inspect.isasyncgenfunction(original):

        @functools.wraps(original)
        async def agen(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside.get():
                inner = original(self, *args, **kwargs)
            else:
                fast, fn = _target(self, name, original, optimize)
                inner = guarded_aiter(fn(*args, **kwargs).__aiter__(), fast)
            async with contextlib.aclosing(inner):  # closed when this one is (not left to the GC)
                async for x in inner:
                    yield x

        return agen
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def coro(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside.get():
                return await original(self, *args, **kwargs)
            fast, fn = _target(self, name, original, optimize)
            token = _inside.set(inside_routed)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                _record(name, owner, exc, _ran_on_teola(fast))
                raise
            finally:
                _inside.reset(token)
            _record(name, owner, result, _ran_on_teola(fast))
            return result

        return coro
    if inspect.isgeneratorfunction(original):

        @functools.wraps(original)
        def gen(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside.get():
                yield from original(self, *args, **kwargs)
                return
            fast, fn = _target(self, name, original, optimize)
            yield from guarded_iter(iter(fn(*args, **kwargs)), fast)

        return gen

    @functools.wraps(original)
    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return original(self, *args, **kwargs)
        fast, fn = _target(self, name, original, optimize)
        token = _inside.set(inside_routed)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _record(name, owner, exc, _ran_on_teola(fast))
            raise
        finally:
            _inside.reset(token)
        if isinstance(result, types.AsyncGeneratorType):  # a plain method returning a stream (astream_events)
            return guarded_aiter(result, fast)
        if isinstance(result, types.GeneratorType):
            return guarded_iter(result, fast)
        _record(name, owner, result, _ran_on_teola(fast))
        return result

    return plain
