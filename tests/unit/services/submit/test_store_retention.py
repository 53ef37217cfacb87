"""The stores' retention (submit service): ended jobs' output deleted and their events compacted once their
retention has run out; live jobs and recent ones untouched; `never` keeps everything."""

from __future__ import annotations

import time

import pytest

from gpuyard.services.submit.retention import sweep
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobPending, JobSubmitted, PendingReason
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import LogKey, open_log_store, split

DAY = 86400.0


@pytest.fixture
async def stores(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    logs = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    yield store, logs
    await logs.close()
    await store.close()


async def job(store, logs, job_id: str, *, ended: bool) -> None:
    ledger = JobLedger(store, None, "/test")
    spec = JobSpec(command="true")
    await ledger.append(job_id, JobSubmitted(job_id=job_id, name="n", tenant="t", user="u", spec=spec))
    for i in range(5):
        reason = PendingReason(code="insufficient_gpus", message=f"wait {i}")
        await ledger.append(job_id, JobPending(job_id=job_id, attempt=1, reason=reason))
    if ended:
        await ledger.append(job_id, JobCancelled(job_id=job_id, attempt=1, by="u"))
    await store.mark_published([s.event.id for s in await store.read_stream(job_id)])
    await logs.append(split(LogKey(job_id, 1, 0), 0, b"hello\n"))


async def test_ended_jobs_lose_their_output_and_intermediate_events_after_the_retention(stores):
    store, logs = stores
    await job(store, logs, "old", ended=True)
    await job(store, logs, "live", ended=False)
    assert await sweep(store, logs, 7 * DAY) == 0  # ended just now

    assert await sweep(store, logs, 7 * DAY, now=time.time() + 8 * DAY) == 1
    assert await logs.keys("old") == []
    assert [s.version for s in await store.read_stream("old")] == [1, 7]
    assert (await store.get_projection("old"))["state"] == "cancelled"
    assert await logs.keys("live") == [LogKey("live", 1, 0)]
    assert len(await store.read_stream("live")) == 6
    assert await sweep(store, logs, 7 * DAY, now=time.time() + 8 * DAY) == 0  # once


async def test_never_keeps_everything(stores):
    store, logs = stores
    await job(store, logs, "old", ended=True)
    assert await sweep(store, logs, 0, now=time.time() + 800 * DAY) == 0
    assert len(await store.read_stream("old")) == 7 and await logs.keys("old")
