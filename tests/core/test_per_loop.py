"""One object per event loop: made on first use on each loop, set up alike, forgotten on close."""

from __future__ import annotations

import asyncio

from teola_core.runtime.per_loop import PerLoop


def test_each_loop_gets_its_own_object_set_up_like_the_others() -> None:
    per_loop: PerLoop[list[str]] = PerLoop()
    made: list[list[str]] = []

    def make() -> list[str]:
        made.append([])
        return made[-1]

    async def use() -> list[str]:
        return per_loop.current(make)

    loops = [asyncio.new_event_loop(), asyncio.new_event_loop()]
    try:
        first = loops[0].run_until_complete(use())
        per_loop.apply_to_all(lambda tags: tags.append("hooked"))
        second = loops[1].run_until_complete(use())
        assert loops[1].run_until_complete(use()) is second  # one per loop
        assert per_loop.get(loops[0], make) is first
    finally:
        for loop in loops:
            loop.close()
    assert first is not second and len(made) == 2
    assert first == ["hooked"] and second == ["hooked"]  # set up when made after apply_to_all too


def test_pop_current_forgets_only_the_running_loops_object() -> None:
    per_loop: PerLoop[object] = PerLoop()

    async def cycle() -> tuple[object, object | None, object]:
        made = per_loop.current(object)
        popped = per_loop.pop_current()
        return made, popped, per_loop.current(object)

    made, popped, again = asyncio.run(cycle())
    assert popped is made and again is not made
    per_loop.clear()
    assert per_loop.values() == []
