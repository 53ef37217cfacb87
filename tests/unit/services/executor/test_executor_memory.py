"""The executor's memory stays flat: what it keeps per attempt is dropped once the attempt is over, however
many jobs the node has run (but the ledger's few jobs that ended last, a fixed number)."""

from __future__ import annotations

import asyncio

from gpuyard.shared.contracts.events.jobs import JobSucceeded
from gpuyard.shared.stores.ledger import ENDED_JOBS
from tests.unit.services.containers import containers

JOBS = 2000  # four times the ended jobs the ledger keeps (ENDED_JOBS)
BURST = 100
SMALL = 16
"""Containers that do not grow with the jobs stay below this (the node's GPUs, the known nodes' addresses)."""


async def test_per_attempt_state_is_dropped_after_2000_jobs(h):
    ex = await h.executor()
    tasks_before = len(asyncio.all_tasks())
    ids = [await h.submit(command=["true"]) for _ in range(JOBS)]
    for k in range(0, JOBS, BURST):
        batch = ids[k : k + BURST]
        await asyncio.gather(*(h.place(ex, job) for job in batch))
        await asyncio.wait(list(ex.backend.watchers))  # each ends once its replica's exit is recorded
        for job in batch:  # the attempt's end, as the bus delivers it to every executor
            await h.deliver(ex, JobSucceeded(job_id=job, attempt=1))
    assert (await h.view(ids[0])).state.value == "succeeded"
    assert (await h.view(ids[-1])).state.value == "succeeded"

    sizes = containers(
        ex,
        "executor",
        ("gpuyard.services.executor", "gpuyard.shared.stores.ledger", "gpuyard.shared.stores.logs"),
        3,
    )
    assert "executor.backend.replicas" in sizes  # the walk reaches the backend's state too
    assert "executor.ledger._known" in sizes  # and the ledger's cache of job views
    assert sizes.pop("executor.ledger._ended") == ENDED_JOBS  # the last to end, however many did
    assert {path: n for path, n in sizes.items() if n > SMALL} == {}
    assert len(asyncio.all_tasks()) <= tasks_before
