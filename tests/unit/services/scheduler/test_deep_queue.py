"""A cycle's work follows what changed, not the depth of the queue: on a full cluster with 20,000 alike jobs
waiting, a cycle looks at the jobs it places and the few it needs to learn each shape's answer, and computes
no reason for the rest until one is read; the reasons read are those a cycle over every job gives."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from gpuyard.services.scheduler import decisions as scheduler_decisions
from gpuyard.services.scheduler.decisions import PENDING_SWEEP_PER_SECOND, PENDING_WRITES_PER_CYCLE
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.scheduling import (
    Allocation,
    GpuAssignment,
    HeldCluster,
    HeldQueue,
    ReplicaAssignment,
    decide,
)
from gpuyard.shared.scheduling import cycle as cycle_module
from gpuyard.shared.scheduling import queue as queue_module
from gpuyard.shared.scheduling.model import SchedulerConfig
from gpuyard.shared.scheduling.reasons import Blocker
from gpuyard.shared.settings.scheduler import SchedulerSettings
from tests.unit.services.scheduler.builders import job, node

TENANTS = 4
WAITING = 20_000


def small(k: int, prefix: str = "wait", **kw):
    return job(
        f"{prefix}-{k:06d}", gpus=0.125, tenant=f"t{k % TENANTS}", cpus=1, submitted_at=1000.0 + k, **kw
    )


PRIORITY = small(0).priority


def full_node(limits: bool = False) -> HeldCluster:
    """64 jobs of 1/8 GPU: the node is full; with `limits`, their time limits end them one a minute from 6000."""
    held = HeldCluster()
    held.put_node(node("a", gpus=8, cpus=256))
    for k in range(64):
        gpu = GpuAssignment(k // 8, 0.125)
        running = small(k, "run", timeout=6000.0 + 60 * k if limits else None)
        held.put(Allocation(running, (ReplicaAssignment(0, "a", (gpu,), 1.0, 0),), 0.0))
    return held


@pytest.fixture
def reasons_made(monkeypatch) -> list[int]:
    made = [0]
    at = Blocker.at

    def counted(self, *args, **kwargs):
        made[0] += 1
        return at(self, *args, **kwargs)

    monkeypatch.setattr(Blocker, "at", counted)
    return made


def cycle(held: HeldCluster, queue, now: float = 5000.0):
    result = decide(held.index(), held.allocations(), queue, SchedulerConfig(), None, now, held.kinds)
    held.decided(result)
    return result


def test_a_full_cluster_looks_at_a_few_of_20000_waiting_jobs(reasons_made) -> None:
    held, queue = full_node(), HeldQueue(small(k) for k in range(WAITING))
    result = cycle(held, queue)
    assert not result.placements and len(result.pending) == WAITING
    assert reasons_made[0] <= 2 * TENANTS  # the head, the one that settles the shape: not 20,000
    last = result.pending[f"wait-{WAITING - 1:06d}"]
    assert last.position == WAITING and last.code == "insufficient_gpu_share"


def test_a_cycle_after_some_jobs_end_looks_at_what_it_places(reasons_made) -> None:
    held, queue = full_node(), HeldQueue(small(k) for k in range(WAITING))
    cycle(held, queue)
    for k in range(8):  # eight jobs end: room for eight more
        held.drop(f"run-{k:06d}")
    reasons_made[0] = 0
    result = cycle(held, queue)
    assert len(result.placements) == 8 and len(result.pending) == WAITING - 8
    assert reasons_made[0] <= 2 * TENANTS


@pytest.mark.parametrize("ends", [1, 3, 7])
def test_fewer_ends_than_reservations_cost_a_cycle_no_walk_of_the_line(reasons_made, ends) -> None:
    # The oldest jobs that fitted when the cycle began (protected, `fitting`) lose their room to jobs ahead of
    # them in fair share's line: they reserve without the cycle walking thousands of jobs to reach them.
    held, queue = full_node(), HeldQueue(small(k) for k in range(WAITING))
    cycle(held, queue)
    for k in range(ends):
        held.drop(f"run-{k:06d}")
    reasons_made[0] = 0
    result = cycle(held, queue)
    assert len(result.placements) == ends and len(result.pending) == WAITING - ends
    assert reasons_made[0] <= 2 * TENANTS


@pytest.mark.parametrize(("ends", "limits"), [(3, True), (5, False), (5, True)])
def test_the_reasons_read_are_those_of_a_cycle_that_looks_at_every_job(monkeypatch, ends, limits) -> None:
    waiting = [small(k) for k in range(600)]
    held = full_node(limits)
    for k in range(ends):
        held.drop(f"run-{k:06d}")
    lazy = cycle(held, HeldQueue(waiting))
    monkeypatch.setattr(cycle_module, "SETTLE_BY_SHAPE", False)  # every job considered one by one
    held = full_node(limits)
    for k in range(ends):
        held.drop(f"run-{k:06d}")
    full = cycle(held, list(waiting))
    assert lazy.placements == full.placements and len(lazy.placements) == ends
    estimated = [job_id for job_id, reason in lazy.pending.items() if reason.estimated_start is not None]
    assert len(estimated) == (
        SchedulerConfig().reservation_depth - ends if limits else 0
    )  # the protected left
    assert dict(lazy.pending.items()) == dict(full.pending.items())
    assert lazy.pending.window(590, 600) == sorted(full.pending.items(), key=lambda kv: kv[1].position)[589:]


def test_a_burst_of_new_jobs_joins_a_deep_queue_in_the_work_of_the_burst(monkeypatch) -> None:
    queue = HeldQueue(small(k) for k in range(WAITING))
    calls = [0]

    def counted(job):
        calls[0] += 1
        return (job.submitted_at, job.job_id)

    monkeypatch.setattr(queue_module, "ARRIVAL", counted)
    for k in range(WAITING, WAITING + 100):
        queue.put(small(k))
    queue.prepare()
    assert calls[0] < 2_000  # (sorting each list again would take a key of each of the 20,100 jobs)
    ordered = sorted(queue.jobs.values(), key=lambda j: (j.submitted_at, j.job_id))
    assert queue.classes[PRIORITY] == ordered


def test_new_jobs_that_arrived_before_some_waiting_ones_take_their_places() -> None:
    rng = random.Random(7)
    queue = HeldQueue(small(k) for k in range(0, 4000, 2))
    for _ in range(5):  # bursts of jobs anywhere in the order (requeued ones keep their first submission)
        for k in rng.sample(range(1, 4000, 2), 100):
            queue.put(small(k))
        queue.prepare()
        ordered = sorted(queue.jobs.values(), key=lambda j: (j.submitted_at, j.job_id))
        assert queue.classes[PRIORITY] == ordered
        for tenant, jobs in queue.tenants[PRIORITY].items():
            assert jobs == [j for j in ordered if j.tenant == tenant]


def test_the_reasons_behind_the_head_of_the_line_are_swept_by_the_second_not_by_the_cycle(
    monkeypatch,
) -> None:
    held, queue = full_node(), HeldQueue(small(k) for k in range(WAITING))
    pending = cycle(held, queue).pending
    clock = [100.0]
    monkeypatch.setattr(scheduler_decisions.time, "monotonic", lambda: clock[0])
    bus = SimpleNamespace(js=None, replicas=1)
    service = SchedulerService(SimpleNamespace(ledger=None, bus=bus), SchedulerSettings())
    head = len(pending.known)  # (the jobs the cycle looked at: a few, the node being full)
    assert 0 < head < 20
    swept: list[str] = []
    for _ in range(1000):  # ten seconds of cycles 10 ms apart
        clock[0] += 0.01
        looked_at = service.decisions.due(pending)
        assert [job_id for job_id, _ in looked_at[:head]] == list(pending)[:head]  # those: every cycle
        swept += [job_id for job_id, _ in looked_at[head:]]
    assert len(swept) == pytest.approx(10 * PENDING_SWEEP_PER_SECOND, abs=PENDING_SWEEP_PER_SECOND / 10)
    assert swept == list(pending)[head : head + len(swept)]  # in turn, from the head on, none twice
    clock[0] += 1000  # a long pause: still at most a cycle's worth
    assert len(service.decisions.due(pending)) <= head + PENDING_WRITES_PER_CYCLE
