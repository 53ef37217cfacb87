"""Scarce nodes (`scheduling/scarcity.py`): a job that could run on many nodes keeps off the few nodes
that a waiting job can only run on, for every placement policy, also when they are the only nodes free.

The cluster is the openb case in small: one G3-like node (8 GPUs, 128 CPUs, 768 GiB), first in inventory, and
eight G2-like nodes (8 GPUs, 96 CPUs, 384 GiB). A job of 120 CPUs and 700 GiB fits only the G3 node; a job of
88 CPUs and 320 GiB fits all nine."""

from __future__ import annotations

import pytest

from gpuyard.shared.scheduling import SchedulerConfig
from gpuyard.shared.scheduling.placement import POLICIES
from tests.unit.services.scheduler.builders import GIB, cluster, decide_snapshot, job, node, running, where

NOW = 10_000.0
POLICY_NAMES = sorted(POLICIES)


def g3_and_g2(busy_g2: int, *more):
    """The G3 node idle (but for `more` running jobs), the first `busy_g2` G2 nodes each held whole by a job
    that ends in an hour."""
    nodes = [node("g3", 8, cpus=128, memory=768 * GIB)] + [
        node(f"g2-{k}", 8, cpus=96, memory=384 * GIB) for k in range(8)
    ]
    held = [
        running(job(f"run-{k}", 8, cpus=8, memory=8 * GIB, timeout=3600), f"g2-{k}", list(range(8)), NOW)
        for k in range(busy_g2)
    ]
    return cluster(*nodes, running=[*held, *more], now=NOW)


def flexible(job_id: str = "flexible", **kw):
    return job(job_id, 8, cpus=88, memory=320 * GIB, submitted_at=1.0, timeout=11 * 86_400, **kw)


def confined(job_id: str = "confined", **kw):
    return job(job_id, 8, cpus=120, memory=700 * GIB, submitted_at=2.0, timeout=3600, **kw)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_flexible_job_leaves_the_only_node_a_waiting_job_fits_and_takes_another_free_one(policy) -> None:
    result = decide_snapshot(g3_and_g2(busy_g2=7), [flexible(), confined()], SchedulerConfig(policy=policy))
    assert where(result, "flexible") == [("g2-7", tuple(range(8)))]
    assert where(result, "confined") == [("g3", tuple(range(8)))]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_flexible_job_waits_rather_than_take_the_only_node_a_waiting_job_fits(policy) -> None:
    """Every G2 node is busy for an hour: the flexible job, first in line, waits for one of them (its backfill
    reservation is there), and the job that fits only the G3 node starts on it now."""
    result = decide_snapshot(g3_and_g2(busy_g2=8), [flexible(), confined()], SchedulerConfig(policy=policy))
    assert [p.job_id for p in result.placements] == ["confined"]
    assert where(result, "confined") == [("g3", tuple(range(8)))]
    reason = result.pending["flexible"]
    assert (reason.code, reason.position, reason.estimated_start) == ("insufficient_gpus", 1, NOW + 3600)
    assert reason.details["kept_nodes"] == 1
    assert "1 node kept for waiting jobs that fit only there" in reason.message


def test_with_no_confined_job_waiting_every_node_is_the_flexible_jobs() -> None:
    result = decide_snapshot(g3_and_g2(busy_g2=8), [flexible()], SchedulerConfig(policy="firstfit"))
    assert where(result, "flexible") == [("g3", tuple(range(8)))]


def test_a_lower_priority_confined_job_keeps_no_node_from_a_higher_priority_one() -> None:
    queue = [flexible(priority=100), confined(priority=10)]
    result = decide_snapshot(g3_and_g2(busy_g2=8), queue, SchedulerConfig(policy="firstfit"))
    assert where(result, "flexible") == [("g3", tuple(range(8)))]


def test_the_rule_can_be_turned_off() -> None:
    config = SchedulerConfig(policy="firstfit", keep_scarce_nodes=False)
    result = decide_snapshot(g3_and_g2(busy_g2=8), [flexible(), confined()], config)
    assert where(result, "flexible") == [("g3", tuple(range(8)))]
    assert result.pending["confined"].code == "insufficient_gpus"


def test_a_job_with_as_few_nodes_is_not_kept_off_them() -> None:
    """Two jobs that fit only the G3 node: the first in line takes it."""
    queue = [confined("first"), confined("second")]
    result = decide_snapshot(g3_and_g2(busy_g2=8), queue, SchedulerConfig(policy="firstfit"))
    assert where(result, "first") == [("g3", tuple(range(8)))]


def g3_half_busy():
    """Every G2 node busy for an hour; the G3 node half held (4 GPUs, 8 CPUs) by a job that ends in an hour."""
    half = running(job("half", 4, cpus=8, memory=8 * GIB, timeout=3600), "g3", [0, 1, 2, 3], NOW)
    return g3_and_g2(8, half)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_job_that_leaves_a_kept_node_before_it_drains_may_use_it(policy) -> None:
    """The confined job cannot start before the G3 node's running job ends in an hour: a job of half an hour
    there costs it nothing; one of two hours would make it wait an hour more, and waits itself."""
    short = job("short", 1, cpus=8, memory=8 * GIB, submitted_at=0.5, timeout=1800)
    long = job("long", 1, cpus=8, memory=8 * GIB, submitted_at=0.6, timeout=7200)
    result = decide_snapshot(g3_half_busy(), [short, long, confined()], SchedulerConfig(policy=policy))
    assert [p.job_id for p in result.placements] == ["short"]
    assert where(result, "short")[0][0] == "g3"
    assert result.pending["long"].code == "insufficient_gpus"
    assert result.pending["confined"].estimated_start == NOW + 3600
