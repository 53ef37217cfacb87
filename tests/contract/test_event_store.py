"""One contract suite for every event store adapter.

The embedded SQLite store always runs, and so does MongoDB's adapter on the stand-in, as a replica set
(`mongo-standin`) and as a standalone server (`mongo-standin-standalone`); on a real server (`mongo-real`)
where `tests/contract/conftest.py` finds or starts one, else those cases skip and say which is missing.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobPlaced, JobSubmitted, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.stores.events import Append, ConcurrencyError, EventStore, StoreUnavailable, open_store
from gpuyard.shared.stores.ledger import projection_of
from tests.contract.conftest import (
    EVENT_STORE_BACKENDS,
    SQLITE,
    failing,
    fresh_database,
    refused_url,
    server_url,
)


@pytest.fixture(params=EVENT_STORE_BACKENDS)
async def store(request, tmp_path) -> EventStore:
    if request.param == SQLITE:
        s = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    else:
        s = await open_store(server_url(request, request.param))
    yield s
    if request.param != SQLITE:
        await s.client.drop_database(s.db.name)
    await s.close()


def submitted(job_id: str, tenant: str = "t", minute: int = 0):
    from datetime import UTC, datetime

    data = JobSubmitted(job_id=job_id, name="n", tenant=tenant, user="u", spec=JobSpec(command="true"))
    return make_event(
        data, source="/test", id=f"{job_id}-sub", time=datetime(2026, 1, 1, 0, minute, tzinfo=UTC)
    )


def placed(job_id: str, event_id: str | None = None):
    data = JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])
    return make_event(data, source="/test", id=event_id or f"{job_id}-placed")


async def test_append_then_read_in_order(store):
    e1, e2 = submitted("a"), placed("a")
    assert (await store.append("a", 0, [e1])).version == 1
    assert (await store.append("a", 1, [e2])).version == 2
    events = await store.read_stream("a")
    assert [(s.version, s.event) for s in events] == [(1, e1), (2, e2)]
    assert await store.read_stream("unknown") == []
    assert [(s.version, s.event) for s in await store.read_stream("a", after_version=1)] == [(2, e2)]
    assert await store.read_stream("a", after_version=2) == []


async def test_a_stale_expected_version_is_a_conflict_never_an_overwrite(store):
    await store.append("a", 0, [submitted("a")])
    with pytest.raises(ConcurrencyError) as exc:
        await store.append("a", 0, [placed("a")])
    assert (exc.value.expected, exc.value.actual) == (0, 1)
    with pytest.raises(ConcurrencyError):
        await store.append("a", 5, [placed("a")])  # ahead of the stream: no gaps either
    assert len(await store.read_stream("a")) == 1


async def test_concurrent_writers_of_one_version_one_wins(store):
    await store.append("a", 0, [submitted("a")])
    results = await asyncio.gather(
        *(store.append("a", 1, [placed("a", f"p{i}")]) for i in range(5)), return_exceptions=True
    )
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if isinstance(r, Exception))
    assert len(await store.read_stream("a")) == 2


async def test_appending_the_same_event_again_changes_nothing(store):
    event = submitted("a")
    await store.append("a", 0, [event])
    again = await store.append("a", 0, [event])
    assert again.duplicate and again.version == 1
    assert len(await store.read_stream("a")) == 1


async def test_projection_is_written_with_the_events(store):
    event = submitted("a", tenant="vision")
    view = apply(None, event)
    await store.append("a", 0, [event], projection_of(view))
    doc = await store.get_projection("a")
    assert doc["state"] == "queued" and doc["tenant"] == "vision" and doc["version"] == 1
    cancel = make_event(JobCancelled(job_id="a", attempt=1, by="u"), source="/t")
    await store.append("a", 1, [cancel], projection_of(apply(view, cancel, version=2)))
    assert (await store.get_projection("a"))["state"] == "cancelled"
    assert await store.get_projection("nope") is None


async def test_listing_is_newest_first_filtered_and_paginated(store):
    for i in range(7):
        job = f"j{i}"
        event = submitted(job, tenant="a" if i % 2 else "b", minute=i)
        await store.append(job, 0, [event], projection_of(apply(None, event)))
    page = await store.list_projections(limit=3)
    assert [d["job_id"] for d in page.items] == ["j6", "j5", "j4"]
    seen = [d["job_id"] for d in page.items]
    while page.next_cursor:
        page = await store.list_projections(limit=3, cursor=page.next_cursor)
        seen += [d["job_id"] for d in page.items]
    assert seen == [f"j{i}" for i in range(6, -1, -1)]
    only_a = await store.list_projections(tenant="a", limit=10)
    assert [d["job_id"] for d in only_a.items] == ["j5", "j3", "j1"]
    assert (await store.list_projections(states=["running"])).items == []
    assert len((await store.list_projections(states=["queued", "running"], limit=50)).items) == 7
    with pytest.raises(ValueError):
        await store.list_projections(cursor="not-a-cursor")


def job_submitted(job_id: str, *, tenant: str, user: str, name: str, minute: int):
    from datetime import UTC, datetime

    data = JobSubmitted(job_id=job_id, name=name, tenant=tenant, user=user, spec=JobSpec(command="true"))
    return make_event(
        data, source="/test", id=f"{job_id}-sub", time=datetime(2026, 1, 1, 0, minute, tzinfo=UTC)
    )


SEARCHED = [  # (job id, tenant, user, name): created a minute apart, in this order
    ("j0", "vision", "ana", "train-resnet"),
    ("j1", "nlp", "bo", "train-bert"),
    ("j2", "vision", "bo", "eval_50%"),
    ("j3", "vision", "ana", "evalx50y"),
    ("j4", "nlp", "Ana", "sweep"),
    ("j5", "vision", "ana", "train-resnet"),
]


async def searched_store(store):
    for minute, (job, tenant, user, name) in enumerate(SEARCHED):
        event = job_submitted(job, tenant=tenant, user=user, name=name, minute=minute)
        await store.append(job, 0, [event], projection_of(apply(None, event)))


async def every_page(store, **filters) -> list[str]:
    """The job ids of every page of a listing, in order, three to a page."""
    page = await store.list_projections(limit=3, **filters)
    seen = [d["job_id"] for d in page.items]
    while page.next_cursor:
        page = await store.list_projections(limit=3, cursor=page.next_cursor, **filters)
        seen += [d["job_id"] for d in page.items]
    assert (
        len(seen)
        == len(set(seen))
        == await store.count_projections(**{k: v for k, v in filters.items() if k != "order"})
    )
    return seen


async def test_listing_oldest_first_pages_through_every_projection_once(store):
    await searched_store(store)
    assert await every_page(store, order="oldest") == ["j0", "j1", "j2", "j3", "j4", "j5"]
    assert await every_page(store) == ["j5", "j4", "j3", "j2", "j1", "j0"]
    assert await every_page(store, tenant="vision", order="oldest") == ["j0", "j2", "j3", "j5"]
    newest = await store.list_projections(limit=2)
    with pytest.raises(ValueError):  # a cursor of the newest-first listing does not go on oldest first
        await store.list_projections(limit=2, cursor=newest.next_cursor, order="oldest")
    oldest = await store.list_projections(limit=2, order="oldest")
    with pytest.raises(ValueError):
        await store.list_projections(limit=2, cursor=oldest.next_cursor)


async def test_listing_by_user_name_and_searched_text(store):
    await searched_store(store)
    assert await every_page(store, user="ana") == ["j5", "j3", "j0"]  # exact: not "Ana"
    assert await every_page(store, name="train-resnet", order="oldest") == ["j0", "j5"]
    assert await every_page(store, user="bo", tenant="vision") == ["j2"]
    assert await every_page(store, user="nobody") == []
    # search: in the id, the name, the user or the tenant, in any case
    assert await every_page(store, search="ANA") == ["j5", "j4", "j3", "j0"]
    assert await every_page(store, search="RESNET") == ["j5", "j0"]
    assert await every_page(store, search="j3") == ["j3"]
    assert await every_page(store, search="nlp") == ["j4", "j1"]
    assert await every_page(store, search="train", states=["running"]) == []
    # `%` and `_` are themselves, never wildcards (nor `.` and `*` a pattern)
    assert await every_page(store, search="_50%") == ["j2"]
    assert await every_page(store, search="l_5") == ["j2"]
    assert await every_page(store, search="x50") == ["j3"]
    assert await every_page(store, search=".*") == []
    assert await every_page(store, search="\\") == []
    assert await store.count_projections() == 6
    assert await store.count_projections(states=["queued"], tenant="nlp") == 2


async def test_the_oldest_of_each_tenants_projections_in_some_states(store):
    await searched_store(store)
    at = {d["job_id"]: d["created_at"] for d in (await store.list_projections(limit=10)).items}
    stored = {job: (await store.get_projection(job))["created_at"] for job in at}
    assert at == stored
    queued = await store.oldest_by_tenant(states=["queued"])
    assert {t: datetime.fromisoformat(v) for t, v in queued.items()} == {
        "vision": datetime.fromisoformat(at["j0"]),
        "nlp": datetime.fromisoformat(at["j1"]),
    }
    view = apply(None, job_submitted("j0", tenant="vision", user="ana", name="train-resnet", minute=0))
    cancel = make_event(JobCancelled(job_id="j0", attempt=1, by="u"), source="/t")
    await store.append("j0", 1, [cancel], projection_of(apply(view, cancel, version=2)))
    queued = await store.oldest_by_tenant(states=["queued"])
    assert datetime.fromisoformat(queued["vision"]) == datetime.fromisoformat(at["j2"])
    assert list(await store.oldest_by_tenant(states=["cancelled"])) == ["vision"]
    assert await store.oldest_by_tenant(states=["running"]) == {}


async def test_versions_counts_and_id_prefixes_of_the_projections(store):
    for job, tenant in [("ab12", "a"), ("ab34", "b"), ("ab35", "a"), ("cd56", "a")]:
        event = submitted(job, tenant=tenant)
        await store.append(job, 0, [event], projection_of(apply(None, event)))
    view = apply(None, submitted("cd56", tenant="a"))
    cancel = make_event(JobCancelled(job_id="cd56", attempt=1, by="u"), source="/t")
    await store.append("cd56", 1, [cancel], projection_of(apply(view, cancel, version=2)))

    assert await store.versions(states=["queued"]) == {"ab12": 1, "ab34": 1, "ab35": 1}
    everything = {"ab12": 1, "ab34": 1, "ab35": 1, "cd56": 2}
    assert await store.versions(states=["queued", "cancelled"]) == everything
    assert await store.count_by_tenant(states=["queued"]) == {"a": 2, "b": 1}
    assert await store.count_by_tenant(states=["running"]) == {}
    assert await store.ids_starting("ab3") == ["ab34", "ab35"]
    assert await store.ids_starting("ab3", tenant="a") == ["ab35"]
    assert await store.ids_starting("ab", limit=2) == ["ab12", "ab34"]
    assert await store.ids_starting("ab12") == ["ab12"]
    assert await store.ids_starting("x") == []
    assert await store.ids_starting("a.") == []  # (a prefix is taken literally, never as a pattern)


async def test_versions_of_the_projections_created_before_a_time(store):
    for minute, job in enumerate(["m0", "m1", "m2"]):
        event = submitted(job, minute=minute)
        await store.append(job, 0, [event], projection_of(apply(None, event)))
    assert await store.versions(states=["queued"], created_before="2026-01-01T00:01:00+00:00") == {"m0": 1}
    assert await store.versions(states=["queued"], created_before="2026-01-01T00:01:30+00:00") == {
        "m0": 1,
        "m1": 1,
    }
    assert await store.versions(states=["running"], created_before="2027-01-01T00:00:00+00:00") == {}


async def test_the_feed_of_jobs_ending_whatever_state_they_ended_from(store):
    from gpuyard.shared.contracts.events.jobs import JobStarted, JobSucceeded
    from gpuyard.shared.stores.ledger import JobLedger

    ledger = JobLedger(store, None, "/test")
    for job in ("ran", "dropped", "waits"):
        spec = JobSpec(command="true")
        await ledger.append(job, JobSubmitted(job_id=job, name="n", tenant=f"t-{job}", user="u", spec=spec))
    await ledger.append("dropped", JobCancelled(job_id="dropped", attempt=1, by="u"))  # (from the queue)
    await ledger.append(
        "ran", JobPlaced(job_id="ran", attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])
    )
    await ledger.append("ran", JobStarted(job_id="ran", attempt=1, node="n", replicas=[0]))
    await ledger.append("ran", JobSucceeded(job_id="ran", attempt=1))

    ended = await store.ended_since("")
    assert [(e.stream_id, e.tenant, e.state) for e in ended] == [
        ("dropped", "t-dropped", "cancelled"),
        ("ran", "t-ran", "succeeded"),
    ]
    views = {e.stream_id: await ledger.load(e.stream_id) for e in ended}
    for e in ended:
        view = views[e.stream_id]
        assert datetime.fromisoformat(e.ended_at) == view.finished_at
        assert datetime.fromisoformat(e.submitted_at) == view.attempts[0].queued_at
    assert ended[0].started_at is None
    assert datetime.fromisoformat(ended[1].started_at) == views["ran"].attempts[0].started_at
    # paging: from the last time seen (that job again: the reader passes over it), and a limit
    assert [e.stream_id for e in await store.ended_since(ended[1].ended_at)] == ["ran"]
    assert [e.stream_id for e in await store.ended_since("", limit=1)] == ["dropped"]
    assert await store.ended_since("9999") == []


async def test_a_document_is_replaced_whole(store):
    assert await store.get_document("queue-line") is None
    await store.put_document("queue-line", {"at": "t1", "jobs": ["a", "b"]})
    await store.put_document("other", {"n": 1})
    await store.put_document("queue-line", {"at": "t2", "jobs": ["b"]})
    assert await store.get_document("queue-line") == {"at": "t2", "jobs": ["b"]}
    assert await store.get_document("other") == {"n": 1}


async def test_outbox_lists_unpublished_events_until_marked(store):
    e1, e2 = submitted("a"), placed("a")
    await store.append("a", 0, [e1])
    await store.append("a", 1, [e2])
    assert [e.id for e in await store.unpublished(older_than=0)] == [e1.id, e2.id]
    assert await store.unpublished(older_than=3600) == []
    await store.mark_published([e1.id])
    await store.mark_published([])
    assert [e.id for e in await store.unpublished(older_than=0)] == [e2.id]


async def test_two_handles_on_one_embedded_file_see_each_other(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = await open_store(url), await open_store(url)
    try:
        await a.append("x", 0, [submitted("x")])
        with pytest.raises(ConcurrencyError):
            await b.append("x", 0, [placed("x")])
        assert len(await b.read_stream("x")) == 1
    finally:
        await a.close()
        await b.close()


async def test_append_many_checks_each_stream_on_its_own(store):
    await store.append("a", 0, [submitted("a")])
    await store.append("b", 0, [submitted("b")])
    dup = submitted("d")
    await store.append("d", 0, [dup])
    results = await store.append_many(
        [
            Append("a", 1, [placed("a")]),  # right version: goes in
            Append("b", 0, [placed("b")]),  # stale: refused in its place, the others still go in
            Append("c", 0, [submitted("c")]),  # a new stream
            Append("d", 0, [dup]),  # already stored: a duplicate, nothing changes
        ]
    )
    assert [type(r).__name__ for r in results] == [
        "AppendResult",
        "ConcurrencyError",
        "AppendResult",
        "AppendResult",
    ]
    assert results[0].version == 2 and results[2].version == 1 and results[3].duplicate
    assert (results[1].expected, results[1].actual) == (0, 1)
    assert [len(await store.read_stream(s)) for s in "abcd"] == [2, 1, 1, 1]


async def ended_job(store: EventStore, job_id: str, pending: int = 3):
    """A job queued, told why it waits `pending` times, placed, then cancelled: through the ledger, as the
    services write it (projection included), every event published."""
    from gpuyard.shared.contracts.events.jobs import JobPending, PendingReason
    from gpuyard.shared.stores.ledger import JobLedger

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


async def test_compaction_keeps_the_first_and_last_events_and_the_projection(store):
    before = await ended_job(store, "old")
    await store.append("live", 0, [submitted("live")], projection_of(apply(None, submitted("live"))))
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
    from gpuyard.shared.stores.ledger import JobLedger

    before = await ended_job(store, "old")
    whole = await JobLedger(store, None, "/test").load("old")
    await store.compact("old")
    ledger = JobLedger(store, None, "/test")
    assert await ledger.load("old") == whole
    outcome = await ledger.append("old", before[0].event.data, event_id=before[0].event.id)
    assert outcome.duplicate and not outcome.applied  # the submit's id is still known


# MongoDB's own: a server that is not there or refuses, and the race between a writer's check and its insert


@pytest.fixture(params=[backend for backend in EVENT_STORE_BACKENDS if backend != SQLITE])
async def mongo_store_url(request) -> str:
    async with fresh_database(request, request.param) as url:
        yield url


async def test_mongodb_an_unreachable_server_is_store_unavailable():
    from gpuyard.shared.stores.events.mongo import MongoEventStore

    with refused_url() as url, pytest.raises(StoreUnavailable, match=f"cannot reach MongoDB at {url}"):
        await MongoEventStore.open(url, timeout_ms=200)


async def test_mongodb_a_server_that_refuses_is_store_unavailable_for_every_method(mongo_store_url):
    """What the API answers with a 503 and a service waits out (`gpuyard.shared.runtime.service`), never a driver's error."""
    async with await open_store(mongo_store_url) as store:
        await ended_job(store, "old")
    async with failing(mongo_store_url) as url, await open_store(url) as store:
        calls = {
            "append": lambda: store.append("new", 0, [submitted("new")]),
            "read_stream": lambda: store.read_stream("old"),
            "get_projection": lambda: store.get_projection("old"),
            "list_projections": lambda: store.list_projections(),
            "count_projections": lambda: store.count_projections(),
            "versions": lambda: store.versions(states=["queued"]),
            "count_by_tenant": lambda: store.count_by_tenant(states=["queued"]),
            "oldest_by_tenant": lambda: store.oldest_by_tenant(states=["queued"]),
            "ended_since": lambda: store.ended_since(""),
            "ids_starting": lambda: store.ids_starting("o"),
            "unpublished": lambda: store.unpublished(older_than=0),
            "mark_published": lambda: store.mark_published(["old-sub"]),
            "put_document": lambda: store.put_document("line", {}),
            "get_document": lambda: store.get_document("line"),
            "expired": lambda: store.expired(ended_before="9999"),
            "compact": lambda: store.compact("old"),
        }
        wrong = {}
        for method, call in calls.items():
            try:
                await call()
                wrong[method] = "no error"
            except StoreUnavailable as exc:
                if "MongoDB" not in str(exc):
                    wrong[method] = f"StoreUnavailable without saying MongoDB: {exc}"
            except Exception as exc:
                wrong[method] = repr(exc)
        assert wrong == {}


async def test_mongodb_a_writer_that_loses_the_race_after_its_check_gets_a_conflict(mongo_store_url):
    """A writer checks the stream's version, then inserts: another can append in between. The unique (stream,
    version) index refuses the later insert (in a transaction, the conflict runs it again, and its check then
    fails): a ConcurrencyError naming the winner's version, and nothing of the loser's is kept."""
    async with await open_store(mongo_store_url) as store, await open_store(mongo_store_url) as other:
        view = apply(None, submitted("a"))
        await store.append("a", 0, [submitted("a")], projection_of(view))
        winner = placed("a", "winner")
        events = store.events

        class RacedBeforeItsInsert:
            def __getattr__(self, name):
                return getattr(events, name)

            async def insert_many(self, docs, **kwargs):
                store.events = events  # (once)
                await other.append("a", 1, [winner], projection_of(apply(view, winner, version=2)))
                return await events.insert_many(docs, **kwargs)

        store.events = RacedBeforeItsInsert()
        loser = make_event(JobCancelled(job_id="a", attempt=1, by="u"), source="/t", id="loser")
        with pytest.raises(ConcurrencyError) as exc:
            await store.append("a", 1, [loser], projection_of(apply(view, loser, version=2)))
        assert (exc.value.expected, exc.value.actual) == (1, 2)
        assert [s.event.id for s in await store.read_stream("a")] == ["a-sub", "winner"]
        assert (await store.get_projection("a"))["state"] == apply(view, winner, version=2).state
        assert [e.id for e in await store.unpublished(older_than=0)] == ["a-sub", "winner"]
