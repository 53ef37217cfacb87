"""How long the scheduler service lets events gather before a cycle: short when cycles are cheap, longer when a
long queue makes them expensive, so that cycles never take most of its time."""

from __future__ import annotations

from gpuyard.services.scheduler.service import (
    CYCLE_SHARE,
    MAX_GATHER_SECONDS,
    MIN_GATHER_SECONDS,
    gather_window,
)


def test_cheap_cycles_run_a_few_milliseconds_after_the_event_that_wakes_them():
    assert gather_window(0.0) == MIN_GATHER_SECONDS
    assert gather_window(0.0001) == MIN_GATHER_SECONDS


def test_an_expensive_cycle_is_followed_by_a_longer_wait_that_bounds_the_share_of_time_in_cycles():
    for cycle in (0.005, 0.01):
        window = gather_window(cycle)
        assert window > MIN_GATHER_SECONDS
        assert cycle / (cycle + window) <= 1 / (CYCLE_SHARE + 1) + 1e-9


def test_the_wait_is_bounded_so_a_very_long_cycle_does_not_stall_the_queue():
    assert gather_window(10.0) == MAX_GATHER_SECONDS <= 0.05
