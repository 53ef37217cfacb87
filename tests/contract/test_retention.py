"""The contract of retention (`Retention`), for every event store adapter (`eventstores.py`): the jobs ended
long enough ago, and their streams compacted to the first and last events and the projection."""

from __future__ import annotations

import pytest

from gpuyard.shared.stores.events import ConcurrencyError, StreamKind
from gpuyard.shared.stores.ledger import JobLedger
from tests.contract.conftest import EVENT_STORE_BACKENDS
from tests.contract.eventstores import ended_job, event_store, other_kinds, placed, queued_job


@pytest.fixture(params=EVENT_STORE_BACKENDS)
async def store(request, tmp_path):
    async with event_store(request, tmp_path) as s:
        yield s


async def test_compaction_keeps_the_first_and_last_events_and_the_projection(store):
    before = await ended_job(store, "old")
    await queued_job(store, "live")
    projection = await store.get_projection("old")
    assert projection["state"] == "cancelled"

    assert await store.expired(ended_before="2000-01-01T00:00:00+00:00") == []
    assert await store.expired(ended_before="9999-01-01T00:00:00+00:00") == ["old"]  # never a live job
    assert await store.compact("old") == len(before) - 2
    kept = await store.read_stream("old")
    assert [(s.version, s.event.id) for s in kept] == [
        (1, before[0].event.id),
        (len(before), before[-1].event.id),
    ]
    assert await store.get_projection("old") == projection
    assert (await store.list_projections(states=["cancelled"])).items == [projection]
    assert await store.expired(ended_before="9999-01-01T00:00:00+00:00") == []  # done once
    assert await store.compact("old") == 0
    assert await store.compact("live") == 0  # not ended: nothing changes
    assert len(await store.read_stream("live")) == 1
    await store.reclaim()

    with pytest.raises(ConcurrencyError):  # the stream's version is kept: an older writer is still refused
        await store.append("old", 1, [placed("old")])
    again = await store.append("old", 0, [before[0].event])  # an idempotent submit finds its job again
    assert again.duplicate


async def test_an_ended_stream_with_unpublished_events_is_not_compacted(store):
    events = await ended_job(store, "old")
    await store.append("old", len(events), [placed("old", "late")])  # (the outbox still has it)
    assert await store.compact("old") == 0
    assert len(await store.read_stream("old")) == len(events) + 1


async def test_the_ledger_reads_a_compacted_job_from_its_projection(store):

    before = await ended_job(store, "old")
    whole = await JobLedger(store, None, "/test").load("old")
    await store.compact("old")
    ledger = JobLedger(store, None, "/test")
    assert await ledger.load("old") == whole
    outcome = await ledger.append("old", before[0].event.data, event_id=before[0].event.id)
    assert outcome.duplicate and not outcome.applied  # the submit's id is still known


async def test_only_jobs_expire_and_compact(store):
    await other_kinds(store, state="cancelled", ended_at="2000-01-01T00:00:00+00:00")
    for kind in (StreamKind.ALERT, StreamKind.MODEL, StreamKind.NODE):
        await store.append(f"ab-{kind}", 1, [placed("x", f"{kind}-2")], kind=kind)
        await store.mark_published([f"{kind}-1", f"{kind}-2"])
    assert await store.expired(ended_before="9999-01-01T00:00:00+00:00") == []
    assert await store.compact("ab-alert") == 0
    assert len(await store.read_stream("ab-alert")) == 2
