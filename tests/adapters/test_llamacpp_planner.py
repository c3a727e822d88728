"""The llama.cpp worker's planner: which prefill chunk or decode step comes next (pure, no model)."""

from __future__ import annotations

from teola_adapters.llamacpp.planner import Plan, Work, plan


def decode(query: int, order: int, cap: int = 4, running: bool = True) -> Work:
    return Work((query, order), cap, running)


def prefill(query: int, order: int) -> Work:
    return Work((query, order))


def test_every_running_decode_steps_together_up_to_their_cap() -> None:
    ds = [decode(0, 1), decode(1, 2), decode(2, 3)]
    assert plan([], ds, free=1).step == tuple(ds)
    capped = [decode(0, 1, cap=2), decode(1, 2, cap=2), decode(2, 3, cap=2)]
    assert plan([], capped, free=1).step == tuple(capped[:2])


def test_the_earliest_query_steps_first_whatever_order_its_decode_came_in() -> None:
    late_first_query = decode(0, 9, cap=1)
    early_second_query = decode(1, 2, cap=1)
    assert plan([], [early_second_query, late_first_query], free=1).step == (late_first_query,)


def test_a_smaller_cap_never_shrinks_a_step_already_chosen() -> None:
    a, b, alone, c = decode(0, 1), decode(1, 2), decode(2, 3, cap=1), decode(3, 4)
    assert plan([], [a, b, alone, c], free=0).step == (a, b, c)


def test_a_waiting_decode_joins_only_with_a_free_sequence() -> None:
    running, waiting, other = decode(0, 1), decode(1, 2, running=False), decode(2, 3, running=False)
    assert plan([], [running, waiting, other], free=1).step == (running, waiting)
    assert plan([], [running, waiting], free=0).step == (running,)


def test_a_prefill_of_an_earlier_query_runs_before_the_step() -> None:
    step = decode(1, 1, cap=1)
    early = prefill(0, 5)
    assert plan([early], [step], free=1) == Plan(prefill=early)


def test_a_prefill_of_a_later_query_waits_while_the_step_is_full() -> None:
    step = decode(0, 1, cap=1)
    assert plan([prefill(1, 2)], [step], free=1) == Plan(step=(step,))


def test_a_prefill_fills_a_step_with_room_even_for_a_later_query() -> None:
    step = decode(0, 1, cap=4)
    later = prefill(1, 2)
    assert plan([later], [step], free=1) == Plan(prefill=later)


def test_the_begun_prefill_goes_on_before_other_prefills() -> None:
    begun, earlier = prefill(3, 7), prefill(0, 8)
    assert plan([earlier], [], free=1, begun=begun) == Plan(prefill=begun)


def test_an_earlier_decode_preempts_a_begun_prefill_between_chunks() -> None:
    begun, urgent = prefill(2, 3), decode(0, 9, cap=1, running=False)
    assert plan([], [urgent], free=1, begun=begun) == Plan(step=(urgent,))


def test_nothing_to_do_is_idle() -> None:
    assert plan([], [], free=3).idle
    assert plan([], [decode(0, 1, running=False)], free=0).idle
