"""The embedded store's listing of jobs as the dashboard's jobs page asks for it: which index answers each
query (a page's rows are found in an index that holds every column a listing orders by and filters on, and
only their documents are read: never those of every job of the states asked for), and an events.db of an
older release gaining the user and name columns its filters read."""

from __future__ import annotations

import sqlite3

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, apply
from gpuyard.shared.stores.events.sqlite import SqliteEventStore
from gpuyard.shared.stores.ledger import projection_of

EVERY_STATE = [s.value for s in JobState]


async def stored_jobs(store: SqliteEventStore, count: int) -> None:
    for n in range(count):
        data = JobSubmitted(
            job_id=f"job-{n}",
            name=f"train-{n % 3}",
            tenant="t",
            user=f"u{n % 2}",
            spec=JobSpec(command="true"),
        )
        event = make_event(data, source="/test")
        await store.append(f"job-{n}", 0, [event], projection_of(apply(None, event)))


def plan_of(store: SqliteEventStore, queries: list[str]) -> list[str]:
    [query] = queries
    return [row[-1] for row in store.read_conn.execute("EXPLAIN QUERY PLAN " + query).fetchall()]


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"states": EVERY_STATE}, "projections_state_listing"),  # the jobs page: every state, newest first
        ({"states": EVERY_STATE, "order": "oldest"}, "projections_state_listing"),
        ({"states": EVERY_STATE, "search": "train"}, "projections_state_listing"),
        ({"states": EVERY_STATE, "user": "u1"}, "projections_state_listing"),
        ({"states": ["queued"], "order": "oldest"}, "projections_state_listing"),
    ],
)
async def test_a_listing_reads_an_index_in_its_order_and_never_sorts_every_row(tmp_path, filters, index):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        await stored_jobs(store, 5)
        queries: list[str] = []
        store.read_conn.set_trace_callback(queries.append)
        assert len((await store.list_projections(limit=2, **filters)).items) == 2
        store.read_conn.set_trace_callback(None)
        steps = plan_of(store, queries)
        assert any(f"COVERING INDEX {index}" in step for step in steps), steps  # (the page's rows: no doc)
        assert any("rowid=?" in step for step in steps), steps  # (then the documents of the page alone)
    finally:
        await store.close()


async def test_a_search_or_a_count_by_user_reads_the_listing_index_alone(tmp_path):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        await stored_jobs(store, 6)
        for filters, expected in (({"search": "RAIN-1"}, 2), ({"user": "u0"}, 3), ({"name": "train-2"}, 2)):
            queries: list[str] = []
            store.read_conn.set_trace_callback(queries.append)
            assert await store.count_projections(states=EVERY_STATE, **filters) == expected
            store.read_conn.set_trace_callback(None)
            steps = plan_of(store, queries)
            assert any("COVERING INDEX projections_state_listing" in step for step in steps), (filters, steps)
    finally:
        await store.close()


async def test_a_file_of_an_older_release_gains_the_user_and_name_of_its_jobs(tmp_path):
    """Opened by this release, an events.db made before the listing's filters finds its jobs by user and name."""
    old = sqlite3.connect(tmp_path / "events.db")
    old.executescript(
        "CREATE TABLE projections (stream_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL,"
        " created_at TEXT NOT NULL, version INTEGER NOT NULL, doc TEXT NOT NULL, ended_at TEXT,"
        " compacted INTEGER NOT NULL DEFAULT 0);"
        "CREATE INDEX projections_state ON projections (state, created_at DESC);"
        """INSERT INTO projections VALUES ('a1', 't', 'queued', '2026-01-01', 1,
           '{"job_id": "a1", "user": "ana", "name": "train"}', NULL, 0);"""
        """INSERT INTO projections VALUES ('b2', 't', 'queued', '2026-01-02', 1,
           '{"job_id": "b2", "user": "bo", "name": "eval"}', NULL, 0);"""
    )
    old.close()
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        assert [d["job_id"] for d in (await store.list_projections(user="ana")).items] == ["a1"]
        assert [d["job_id"] for d in (await store.list_projections(name="eval")).items] == ["b2"]
        assert [d["job_id"] for d in (await store.list_projections(search="BO")).items] == ["b2"]
        indexes = {
            row[0] for row in store.read_conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        assert "projections_state_listing" in indexes and "projections_state" not in indexes
    finally:
        await store.close()
    again = await SqliteEventStore.open(tmp_path / "events.db")  # a second open changes nothing
    assert await again.count_projections(user="bo") == 1
    await again.close()
