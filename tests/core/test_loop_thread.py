"""`LoopThread`: sync callers' event loop; closing it winds its tasks down, as `asyncio.run` does."""

from __future__ import annotations

import asyncio

import pytest

from teola_core.runtime.loop_thread import LoopThread


def test_run_returns_the_coroutines_result_and_raises_its_error() -> None:
    thread = LoopThread("test")

    async def double(x: int) -> int:
        return 2 * x

    async def fail() -> None:
        raise KeyError("boom")

    try:
        assert thread.run(double(21)) == 42
        with pytest.raises(KeyError, match="boom"):
            thread.run(fail())
    finally:
        thread.close()


def test_close_cancels_the_remaining_tasks_and_lets_them_clean_up() -> None:
    thread = LoopThread("test")
    cleaned: list[str] = []
    background: list[asyncio.Task[None]] = []

    async def forever(started: asyncio.Event) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            cleaned.append("cleaned up")

    async def start() -> None:
        started = asyncio.Event()
        background.append(asyncio.get_running_loop().create_task(forever(started)))
        await started.wait()

    thread.run(start())
    thread.close()
    assert cleaned == ["cleaned up"]
    assert background[0].cancelled()
    thread.close()  # idempotent


def test_an_error_left_in_a_task_is_reported_not_dropped() -> None:
    thread = LoopThread("test")
    reported: list[BaseException | None] = []
    background: list[asyncio.Task[None]] = []

    async def start() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context.get("exception")))
        started = asyncio.Event()

        async def fails_on_cancel() -> None:
            try:
                started.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed") from None

        background.append(loop.create_task(fails_on_cancel()))
        await started.wait()

    thread.run(start())
    thread.close()
    assert [str(e) for e in reported] == ["cleanup failed"]
