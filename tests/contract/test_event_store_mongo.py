"""MongoDB's own part of the event store's contract: a server that is not there or refuses, and the race
between a writer's check and its insert (on the stand-in, as a replica set and standalone, and on a real server
where `tests/contract/conftest.py` finds or starts one)."""

from __future__ import annotations

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelled
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.stores.events import ConcurrencyError, StoreUnavailable, open_store
from gpuyard.shared.stores.ledger import projection_of
from tests.contract.conftest import (
    EVENT_STORE_BACKENDS,
    SQLITE,
    failing,
    failing_app,
    fresh_database,
    refused_url,
    with_query,
)
from tests.contract.eventstores import ended_job, placed, submitted


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
    app = failing_app()  # (opened while the server answers: opening reads the schema's version)
    async with (
        await open_store(with_query(mongo_store_url, appName=app)) as store,
        failing(mongo_store_url, app=app),
    ):
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
