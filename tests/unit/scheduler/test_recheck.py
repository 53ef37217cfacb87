"""The periodic resync compares versions with the event store and reads again only what differs: a job whose
events the scheduler missed (its submission, its end, a later change) is repaired, and nothing else is read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.scheduler.main import SchedulerService
from shared.events import JobCancelled, JobSubmitted
from shared.jobspec import JobSpec
from shared.jobstate import JobState
from shared.ledger import JobLedger
from shared.settings import SchedulerSettings
from shared.store import open_store


@pytest.fixture
async def store(tmp_path):
    s = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    yield s
    await s.close()


def scheduler(store) -> SchedulerService:
    service = SimpleNamespace(
        ledger=JobLedger(store, None, "/scheduler"), store=store, bus=SimpleNamespace(js=None, replicas=1)
    )
    return SchedulerService(service, SchedulerSettings())


def submitted(job_id: str) -> JobSubmitted:
    spec = JobSpec(command="true", resources={"gpus": 1})
    return JobSubmitted(job_id=job_id, name=job_id, tenant="t", user="u", spec=spec)


async def test_what_the_scheduler_missed_is_repaired_and_nothing_else_is_read(store):
    submit = JobLedger(store, None, "/submit")
    for job_id in ("kept", "ends", "changes"):
        await submit.append(job_id, submitted(job_id))
    s = scheduler(store)
    await s.load()
    kept = s.view.jobs["kept"]
    # events the scheduler never hears of (another writer's ledger, no bus)
    await submit.append("new", submitted("new"))
    await submit.append("ends", JobCancelled(job_id="ends", attempt=1, by="u"))
    stale = s.view.jobs["changes"]
    await submit.append("changes", JobCancelled(job_id="changes", attempt=1, by="u"))
    s.view.put_job(stale)  # (still queued, at its old version)

    reads = []
    read_stream = store.read_stream
    store.read_stream = lambda job_id, **kw: reads.append(job_id) or read_stream(job_id, **kw)
    await s.recheck()

    assert set(s.view.jobs) == {"kept", "new"}
    assert s.view.jobs["new"].state == JobState.QUEUED
    assert s.view.jobs["kept"] is kept
    assert sorted(reads) == ["changes", "ends", "new"]
    assert [r.job_id for r in s.view.queue()] == ["kept", "new"]
