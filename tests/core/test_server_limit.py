"""The learned bound on calls at a model server: readings in, a limit out (pure)."""

from __future__ import annotations

import pytest

from teola_core.scheduler.server_limit import START_LIMIT, ServerLimit, ServerReading, fresh, headroom


def test_requests_waiting_at_the_server_set_the_limit_to_what_it_runs_and_a_little_queue() -> None:
    limit = ServerLimit()
    assert limit.limit == START_LIMIT and limit.capacity is None
    assert limit.observe(ServerReading(running=12, waiting=4), in_flight=16, holding=True) == 12 + 1
    assert limit.capacity == 12
    assert [headroom(c) for c in (1, 8, 16, 64)] == [1, 1, 2, 8]


def test_it_doubles_while_calls_are_held_and_the_server_has_room_then_grows_by_one() -> None:
    limit = ServerLimit(start=4)
    assert limit.observe(ServerReading(running=4, waiting=0), in_flight=4, holding=True) == 8
    assert limit.observe(ServerReading(running=8, waiting=0), in_flight=8, holding=True) == 16
    assert limit.observe(ServerReading(running=10, waiting=6), in_flight=16, holding=True) == 11
    assert limit.observe(ServerReading(running=10, waiting=0), in_flight=11, holding=True) == 11  # one not there
    assert limit.observe(ServerReading(running=11, waiting=0), in_flight=11, holding=True) == 12
    assert limit.capacity == 10 and limit.readings == 5


def test_with_nothing_held_the_limit_stays_and_slow_start_does_not_wait_for_our_calls_to_arrive() -> None:
    limit = ServerLimit(start=4)
    assert limit.observe(ServerReading(running=4, waiting=0), in_flight=4, holding=False) == 4
    early = ServerReading(running=1, waiting=0)
    assert not fresh(early, in_flight=4)
    assert limit.observe(early, in_flight=4, holding=True) == 8  # no queue seen: holding is the costly mistake
    assert limit.capacity is None and limit.room == 4


def test_the_capacity_is_the_most_seen_running_while_requests_waited() -> None:
    limit = ServerLimit(start=8)
    assert limit.observe(ServerReading(running=6, waiting=2), in_flight=8, holding=True) == 7
    assert limit.observe(ServerReading(running=3, waiting=5), in_flight=8, holding=True) == 7  # new requests queued
    assert limit.observe(ServerReading(running=8, waiting=1), in_flight=9, holding=True) == 9
    assert limit.capacity == 8


def test_other_clients_requests_count_as_the_servers_load() -> None:
    limit = ServerLimit(start=4)
    assert limit.observe(ServerReading(running=6, waiting=0), in_flight=4, holding=True) == 8
    assert limit.observe(ServerReading(running=0, waiting=3), in_flight=2, holding=True) == 6 + 1  # it ran 6 before
    fresh_start = ServerLimit(start=4)
    assert fresh_start.observe(ServerReading(running=0, waiting=3), in_flight=2, holding=True) == 2  # 1 runs, 1 queues
    assert fresh_start.capacity == 1


def test_a_bad_start_is_refused() -> None:
    with pytest.raises(ValueError, match="starting limit must be at least 1, got 0"):
        ServerLimit(start=0)


def test_while_learning_a_reading_is_worth_it_at_each_new_high_of_calls_there() -> None:
    limit = ServerLimit()
    assert limit.worth_reading(in_flight=1, held=0)  # nothing shown yet
    limit.observe(ServerReading(running=3, waiting=0), in_flight=3, holding=False)
    assert limit.room == 3 and not limit.worth_reading(in_flight=3, held=0)
    assert limit.worth_reading(in_flight=4, held=0)  # more than it was seen to hold without a queue
    limit.observe(ServerReading(running=4, waiting=2), in_flight=6, holding=False)
    assert limit.capacity == 4 and limit.limit == 5
    assert not limit.worth_reading(in_flight=5, held=0)  # known: only calls waiting here matter
    assert limit.worth_reading(in_flight=5, held=1)


def test_one_reading_with_a_queue_never_sets_the_capacity_below_what_ran_without_one() -> None:
    limit = ServerLimit()
    limit.observe(ServerReading(running=32, waiting=0), in_flight=32, holding=True)
    assert limit.observe(ServerReading(running=3, waiting=5), in_flight=40, holding=True) == 32 + 4
    assert limit.capacity == 32
