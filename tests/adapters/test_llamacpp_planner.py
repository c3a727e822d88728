"""The llama.cpp worker's planner: which prefill chunk or decode step comes next (pure, no model)."""

from __future__ import annotations

import pytest

from teola_adapters.llamacpp.planner import Plan, Work, cost_curve, costless_step_size, extra_seconds, plan, step_size


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
    assert plan([prefill(1, 2)], [step], free=1) == Plan(step=(step,), ready=1)


def test_a_prefill_fills_a_step_with_room_even_for_a_later_query() -> None:
    step = decode(0, 1, cap=4)
    later = prefill(1, 2)
    assert plan([later], [step], free=1) == Plan(prefill=later)


def test_a_begun_prefill_goes_on_unless_an_earlier_one_can_start_beside_it() -> None:
    begun, earlier, later = prefill(3, 7), prefill(0, 8), prefill(5, 9)
    # a later question's prompt reached the engine first: the earlier question's goes ahead,
    # the begun one keeps its sequence and resumes after
    assert plan([earlier], [], free=1, begun=[begun]) == Plan(prefill=earlier)
    assert plan([earlier], [], free=0, begun=[begun], may_start=False) == Plan(prefill=begun)  # no sequence free
    assert plan([later], [], free=1, begun=[begun]) == Plan(prefill=begun)
    assert plan([], [], free=1, begun=[begun, earlier]) == Plan(prefill=earlier)  # the best-ranked begun one


def test_an_earlier_decode_preempts_a_begun_prefill_between_chunks() -> None:
    begun, urgent = prefill(2, 3), decode(0, 9, cap=1, running=False)
    assert plan([], [urgent], free=1, begun=[begun]) == Plan(step=(urgent,), ready=1)


def test_nothing_to_do_is_idle() -> None:
    assert plan([], [], free=3).idle
    assert plan([], [decode(0, 1, running=False)], free=0).idle


# -- step size from the measured step cost -------------------------------------------------
def test_where_a_step_of_two_costs_two_of_one_the_earliest_query_goes_alone() -> None:
    costs = cost_curve({1: 0.012, 2: 0.024, 4: 0.039})  # measured here: 4 together pay a little, 2 not at all
    assert [step_size(n, costs) for n in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert [step_size(n, costs, slack=0.03) for n in (1, 2, 3, 4)] == [1, 1, 3, 4]  # held to the total


def test_where_batching_pays_decodes_step_in_pairs_or_all_together() -> None:
    costs = cost_curve({1: 0.016, 2: 0.022, 4: 0.036})  # another 2-core host: a step of 4 costs 2.25 of 1
    assert [step_size(n, costs) for n in (1, 2, 3, 4)] == [1, 2, 2, 3]
    assert [step_size(n, costs, slack=0.03) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]


def test_the_extra_a_smaller_step_costs_is_its_loss_against_all_together() -> None:
    costs = cost_curve({1: 0.012, 2: 0.024, 4: 0.039})
    assert extra_seconds(1, 2, costs) == pytest.approx(0.0)  # two together cost two alone
    assert extra_seconds(1, 4, costs) == pytest.approx(0.012 - 0.039 / 4)
    assert extra_seconds(4, 4, costs) == 0.0


def test_where_batching_buys_nothing_decodes_go_one_at_a_time() -> None:
    costs = cost_curve({1: 0.010, 2: 0.025, 4: 0.040})
    assert [step_size(n, costs, slack=0.03) for n in (2, 3, 4)] == [1, 1, 1]


def test_the_chosen_schedule_is_never_slower_in_total_than_batching_beyond_the_slack() -> None:
    for points in ({1: 10, 2: 19, 3: 27, 4: 34}, {1: 10, 2: 20, 3: 30, 4: 40}, {1: 10, 2: 11, 3: 12, 4: 13}):
        costs = cost_curve(points)
        for n in (2, 3, 4):
            k = step_size(n, costs, slack=0.03)
            groups = [k] * (n // k) + ([n % k] if n % k else [])
            assert sum(costs(g) for g in groups) <= 1.03 * costs(n)


def test_cost_curve_interpolates_between_measured_counts() -> None:
    costs = cost_curve({1: 10.0, 4: 40.0})
    assert costs(2) == pytest.approx(20.0) and costs(8) == pytest.approx(80.0)
    with pytest.raises(ValueError):
        cost_curve({})


def test_a_by_cost_step_takes_the_size_the_curve_chooses_best_ranked_first() -> None:
    ds = [Work((0, 1), 4, True, by_cost=True), Work((1, 2), 4, True, by_cost=True), Work((2, 3), 4, True, by_cost=True)]
    assert plan([], ds, free=0, size=lambda n, potential: 1).step == (ds[0],)
    plain = [Work((0, 1), 4, True), Work((1, 2), 4, True)]
    assert plan([], plain, free=0, size=lambda n, potential: 1).step == tuple(plain)  # not by cost: every ready decode


def test_by_cost_a_later_prefill_waits_unless_its_decode_joining_would_pay() -> None:
    step, later = Work((0, 1), 4, True, by_cost=True), prefill(1, 2)
    assert plan([later], [step], free=1, size=lambda n, potential: 1) == Plan(step=(step,), ready=1)  # 2 would not pay
    assert plan([later], [step], free=1, size=lambda n, potential: n) == Plan(prefill=later)  # it would: fill the step


def test_a_by_cost_step_is_charged_against_the_step_waiting_prefills_would_fill() -> None:
    step = Work((0, 1), 4, True, by_cost=True)
    full, partial = Work((1, 2), joins=True), Work((2, 3))  # a prompt whose decode follows; a prefix only
    seen: list[tuple[int, int]] = []

    def size(n: int, potential: int) -> int:
        seen.append((n, potential))
        return 1

    # the earlier decode steps alone, but what that costs counts against a step of two:
    # the full prompt's decode would have joined it; the partial prefill's prefix would not
    assert plan([full, partial], [step], free=2, size=size) == Plan(step=(step,), ready=2)
    assert seen[0] == (1, 2)
    capped = Work((0, 1), 1, True, by_cost=True)  # a decode that steps alone anyway: nothing to charge
    assert plan([full], [capped], free=2, size=lambda n, potential: n).ready == 1


def test_decodes_step_fewer_only_where_that_costs_nothing_in_total() -> None:
    here = cost_curve({1: 0.012, 2: 0.024, 3: 0.032, 4: 0.039})  # a step of 2 costs 2 of 1; 4 pay a little
    assert [costless_step_size(n, n, here) for n in (1, 2, 3, 4)] == [1, 1, 3, 4]
    assert costless_step_size(2, 4, here) == 2  # two more prompts would join: alone costs what 4 together save
    batching = cost_curve({1: 0.016, 2: 0.022, 4: 0.036})  # another 2-core host: batching pays
    assert [costless_step_size(n, n, batching) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
    for costs in (here, batching, cost_curve({1: 10, 2: 11, 3: 12, 4: 13}), cost_curve({1: 10, 2: 25, 4: 40})):
        for n in (2, 3, 4):
            k = costless_step_size(n, n, costs)
            assert k * costs(n) / n >= costs(k) - 1e-12  # the step's share of a step of all, or less


def partial(query: int, order: int) -> Work:
    return Work((query, order), partial=True)


def test_a_partial_prefill_only_fills_time_the_engine_would_idle() -> None:
    early_prefix, later_decode, later_prompt = partial(0, 1), decode(1, 2, cap=1), Work((2, 3), joins=True)
    assert plan([early_prefix], [later_decode], free=2) == Plan(step=(later_decode,), ready=1)
    assert plan([early_prefix, later_prompt], [], free=2) == Plan(prefill=later_prompt)
    assert plan([early_prefix], [], free=2) == Plan(prefill=early_prefix)


def test_a_begun_partial_prefill_resumes_only_when_nothing_else_is_ready() -> None:
    begun, other = partial(0, 1), partial(1, 2)
    step = decode(2, 3, cap=1)
    assert plan([], [step], free=1, begun=[begun]) == Plan(step=(step,), ready=1)
    assert plan([other], [], free=1, begun=[begun]) == Plan(prefill=begun)  # it holds a sequence: it goes on
