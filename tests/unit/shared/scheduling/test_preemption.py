"""Choosing preemption victims by the work they lose (`shared/scheduling/preemption.py`): what a running job did
since its latest checkpoint, or since its start without one; borrowed and lower-priority jobs still go first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuyard.shared.scheduling import Allocation, SchedulerConfig
from gpuyard.shared.scheduling.preemption import eligible_victims, lost_work
from tests.unit.services.scheduler.builders import cluster, decide_snapshot, job, node, running

HOUR = 3600.0
NOW = 100_000.0
CONFIG = SchedulerConfig(min_runtime_before_preemption=300)


def saved(alloc: Allocation, at: float | None) -> Allocation:
    return replace(alloc, checkpointed_at=at)


@pytest.mark.parametrize(
    ("started", "checkpointed", "lost"),
    [
        (NOW - HOUR, None, HOUR),  # no checkpoint: all it did since it started
        (NOW - HOUR, NOW - 600, 600),  # since its latest checkpoint
        (NOW - HOUR, NOW - 2 * HOUR, HOUR),  # saved before this attempt started: since the start
        (NOW - HOUR, NOW + 60, 0),  # a checkpoint from the future counts as now
        (NOW + 60, None, 0),  # never below 0
    ],
)
def test_the_work_lost_is_since_the_latest_checkpoint_or_the_start(started, checkpointed, lost):
    alloc = saved(running(job("a", 1), "n0", [0], started), checkpointed)
    assert lost_work(alloc, NOW) == lost


def victims(allocs: list[Allocation], borrowed: frozenset[str] = frozenset()) -> list[str]:
    high = job("high", 1, priority=100)
    found = eligible_victims(high, allocs, set(borrowed), bool(borrowed), False, CONFIG, NOW, set())
    return [a.job.job_id for a in found]


def test_without_checkpoints_the_youngest_goes_first():
    old = running(job("old", 1, priority=10), "n0", [0], NOW - 5 * HOUR)
    young = running(job("young", 1, priority=10), "n0", [1], NOW - HOUR)
    assert victims([old, young]) == ["young", "old"]


def test_an_older_job_that_just_saved_goes_before_a_younger_one_that_never_did():
    old = saved(running(job("old", 1, priority=10), "n0", [0], NOW - 5 * HOUR), NOW - 600)
    young = running(job("young", 1, priority=10), "n0", [1], NOW - HOUR)
    assert victims([old, young]) == ["old", "young"]
    assert [lost_work(a, NOW) for a in (old, young)] == [600, HOUR]


def test_a_checkpoint_of_an_earlier_time_than_the_start_changes_nothing():
    old = saved(running(job("old", 1, priority=10), "n0", [0], NOW - 5 * HOUR), NOW - 6 * HOUR)
    young = running(job("young", 1, priority=10), "n0", [1], NOW - HOUR)
    assert victims([old, young]) == ["young", "old"]


def test_equal_work_lost_goes_to_fewer_gpus_then_the_job_id():
    began = NOW - HOUR
    two = saved(running(job("a-two", 2, priority=10), "n0", [0, 1], NOW - 3 * HOUR), began)
    b_one = running(job("b-one", 1, priority=10), "n0", [2], began)
    a_one = saved(running(job("a-one", 1, priority=10), "n0", [3], NOW - 2 * HOUR), began)
    assert victims([two, b_one, a_one]) == ["a-one", "b-one", "a-two"]


def test_borrowed_and_lower_priority_jobs_still_go_before_those_that_lose_less():
    lowest = running(job("lowest", 1, priority=5), "n0", [0], NOW - 5 * HOUR)
    low_saved = saved(running(job("low-saved", 1, priority=10), "n0", [1], NOW - 5 * HOUR), NOW - 60)
    assert victims([low_saved, lowest]) == ["lowest", "low-saved"]
    mine = saved(running(job("mine", 1, priority=10), "n0", [2], NOW - 5 * HOUR), NOW - 60)
    lent = running(job("lent", 1, tenant="other", priority=10), "n0", [3], NOW - 5 * HOUR)
    assert victims([mine, lent], borrowed={"lent"}) == ["lent", "mine"]


def test_the_cycle_preempts_the_job_that_loses_the_least():
    old = saved(running(job("old", 1, priority=10), "n0", [0], NOW - 5 * HOUR), NOW - 600)
    young = running(job("young", 1, priority=10), "n0", [1], NOW - HOUR)
    state = cluster(node("n0", 2), running=[old, young], now=NOW)
    result = decide_snapshot(state, [job("high", 1, priority=100)], CONFIG)
    assert [(p.job_id, p.by_job, p.lost_work_seconds) for p in result.preemptions] == [("old", "high", 600)]
