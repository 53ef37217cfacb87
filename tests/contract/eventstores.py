"""What the event store's contract suites share: a store of each backend, and the streams the cases write.

Each capability of the store (`gpuyard.shared.stores.events`: recorder, projections, documents, retention) has
its suite (`test_event_recorder.py`, `test_projections.py`, `test_document_store.py`, `test_retention.py`), run
over the embedded SQLite store always, and over MongoDB's adapter on the stand-in, as a replica set
(`mongo-standin`) and as a standalone server (`mongo-standin-standalone`), and on a real server (`mongo-real`)
where `tests/contract/conftest.py` finds or starts one, else those cases skip and say which is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobPending,
    JobPlaced,
    JobSubmitted,
    PendingReason,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.stores.events import EventStore, Projection, StoredEvent, StreamKind, open_store
from gpuyard.shared.stores.ledger import JobLedger, projection_of
from tests.contract.conftest import SQLITE, server_url


@contextlib.asynccontextmanager
async def event_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventStore]:
    """A fresh store of the backend `request.param` names, dropped at the end (MongoDB's database)."""
    if request.param == SQLITE:
        store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    else:
        store = await open_store(server_url(request, request.param))
    try:
        yield store
    finally:
        if request.param != SQLITE:
            await store.client.drop_database(store.db.name)  # type: ignore[attr-defined]
        await store.close()


def submitted(job_id: str, tenant: str = "t", minute: int = 0) -> CloudEvent:
    data = JobSubmitted(job_id=job_id, name="n", tenant=tenant, user="u", spec=JobSpec(command="true"))
    return make_event(
        data, source="/test", id=f"{job_id}-sub", time=datetime(2026, 1, 1, 0, minute, tzinfo=UTC)
    )


def placed(job_id: str, event_id: str | None = None) -> CloudEvent:
    data = JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])
    return make_event(data, source="/test", id=event_id or f"{job_id}-placed")


def cancelled(job_id: str, event_id: str | None = None) -> CloudEvent:
    return make_event(JobCancelled(job_id=job_id, attempt=1, by="u"), source="/t", id=event_id)


async def queued_job(store: EventStore, job_id: str, tenant: str = "t", minute: int = 0) -> None:
    """A job's first event and its projection, as the ledger writes them."""
    event = submitted(job_id, tenant=tenant, minute=minute)
    await store.append(job_id, 0, [event], projection_of(apply(None, event)))


def job_submitted(job_id: str, *, tenant: str, user: str, name: str, minute: int) -> CloudEvent:
    data = JobSubmitted(job_id=job_id, name=name, tenant=tenant, user=user, spec=JobSpec(command="true"))
    return make_event(
        data, source="/test", id=f"{job_id}-sub", time=datetime(2026, 1, 1, 0, minute, tzinfo=UTC)
    )


async def ended_job(store: EventStore, job_id: str, pending: int = 3) -> list[StoredEvent]:
    """A job queued, told why it waits `pending` times, placed, then cancelled: through the ledger, as the
    services write it (projection included), every event published."""
    ledger = JobLedger(store, None, "/test")
    await ledger.append(
        job_id,
        JobSubmitted(job_id=job_id, name="n", tenant="t", user="u", spec=JobSpec(command="true")),
        event_id=f"{job_id}-sub",
    )
    for i in range(pending):
        reason = PendingReason(code="insufficient_gpus", message=f"wait {i}")
        await ledger.append(job_id, JobPending(job_id=job_id, attempt=1, reason=reason))
    await ledger.append(job_id, JobCancelled(job_id=job_id, attempt=1, by="u"))
    events = await store.read_stream(job_id)
    await store.mark_published([s.event.id for s in events])
    return events


class Note(BaseModel):
    """Another kind's projection document, with a user and a name, as a job's has."""

    name: str = "n"
    user: str = "u"


OTHER_KINDS = [StreamKind.ALERT, StreamKind.MODEL, StreamKind.NODE]


async def other_kinds(store: EventStore, state: str = "queued", ended_at: str | None = None) -> None:
    """A projection of each kind but a job's, in a job's state, of a job's tenant, named as a job, its id beginning
    as one's: only its kind tells it from a job."""
    for kind in OTHER_KINDS:
        stream = f"ab-{kind}"
        projection = Projection(
            stream_id=stream,
            tenant="a",
            state=state,
            created_at="2026-01-01T00:00:00+00:00",
            version=1,
            doc=Note(name=stream),
            ended_at=ended_at,
        )
        await store.append(stream, 0, [placed("x", f"{kind}-1")], projection, kind=kind)
