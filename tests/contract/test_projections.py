"""The contract of the projections (`Projections`), for every event store adapter (`eventstores.py`): one
by id, listings and counts, and the figures of jobs; every query reads the jobs' projections alone, whatever
another kind's projection holds, and a read model reads its own kind's."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.stores.events import StreamKind
from gpuyard.shared.stores.ledger import JobLedger, projection_of
from tests.contract.conftest import EVENT_STORE_BACKENDS
from tests.contract.eventstores import (
    OTHER_KINDS,
    Note,
    cancelled,
    event_store,
    job_submitted,
    other_kinds,
    queued_job,
    submitted,
)


@pytest.fixture(params=EVENT_STORE_BACKENDS)
async def store(request, tmp_path):
    async with event_store(request, tmp_path) as s:
        yield s


async def test_projection_is_written_with_the_events(store):
    event = submitted("a", tenant="vision")
    view = apply(None, event)
    await store.append("a", 0, [event], projection_of(view))
    doc = await store.get_projection("a")
    assert doc["state"] == "queued" and doc["tenant"] == "vision" and doc["version"] == 1
    cancel = cancelled("a")
    await store.append("a", 1, [cancel], projection_of(apply(view, cancel, version=2)))
    assert (await store.get_projection("a"))["state"] == "cancelled"
    assert await store.get_projection("nope") is None


async def test_listing_is_newest_first_filtered_and_paginated(store):
    for i in range(7):
        await queued_job(store, f"j{i}", tenant="a" if i % 2 else "b", minute=i)
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


async def test_no_query_of_jobs_reads_another_kinds_projection(store):
    await queued_job(store, "ab12", tenant="a", minute=5)
    await other_kinds(store)
    job = await store.get_projection("ab12")

    assert (await store.list_projections()).items == [job]
    assert (await store.list_projections(states=["queued"], tenant="a", user="u", search="ab")).items == [job]
    assert await store.count_projections() == 1
    assert await store.count_projections(states=["queued"], search="ab") == 1
    assert await store.versions(states=["queued"]) == {"ab12": 1}
    assert await store.versions(states=["queued"], created_before="2027") == {"ab12": 1}
    assert await store.count_by_tenant(states=["queued"]) == {"a": 1}
    oldest = await store.oldest_by_tenant(states=["queued"])
    assert datetime.fromisoformat(oldest["a"]) == datetime.fromisoformat(job["created_at"])
    assert await store.ids_starting("ab") == ["ab12"]
    assert await store.get_projection("ab-alert") is None


async def test_another_kind_is_read_as_its_own(store):
    await queued_job(store, "ab12", tenant="a")
    await other_kinds(store)
    for kind in OTHER_KINDS:
        doc = Note(name=f"ab-{kind}").model_dump(mode="json")
        assert await store.get_projection(f"ab-{kind}", kind=kind) == doc
        assert await store.get_projection("ab12", kind=kind) is None
        assert (await store.list_projections(kind=kind)).items == [doc]
        assert (await store.list_projections(kind=kind, states=["queued"], name=f"ab-{kind}")).items == [doc]
        assert (await store.list_projections(kind=kind, states=["running"])).items == []
        assert await store.count_projections(kind=kind, tenant="a") == 1
    assert (await store.list_projections(kind=StreamKind.IDLE)).items == []


async def test_the_feed_of_ends_holds_jobs_alone(store):
    await other_kinds(store, state="cancelled", ended_at="2026-01-01T00:00:00+00:00")
    assert await store.ended_since("") == []
    assert await store.versions(states=["cancelled"]) == {}
