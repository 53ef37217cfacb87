"""The embedded store's write path: at once when the lock is free, on the writer thread when another process
holds it, without blocking the event loop and without reordering this process's writes."""

from __future__ import annotations

import asyncio
import sqlite3

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import Append, ConcurrencyError
from gpuyard.shared.stores.events.sqlite import SqliteEventStore


def submitted(job_id: str):
    data = JobSubmitted(job_id=job_id, name="n", tenant="t", user="u", spec=JobSpec(command="true"))
    return make_event(data, source="test")


async def test_a_write_waits_for_another_process_holding_the_lock_without_blocking_the_loop(tmp_path):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    other = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # what a writer in another service holds during its transaction
        first = asyncio.create_task(store.append("job-a", 0, [submitted("job-a")]))
        second = asyncio.create_task(store.append("job-b", 0, [submitted("job-b")]))
        ticks = 0
        for _ in range(20):  # the loop keeps running while both writes wait for the lock
            await asyncio.sleep(0.005)
            ticks += 1
        assert ticks == 20 and not first.done() and not second.done()
        other.execute("COMMIT")
        assert (await first).version == 1 and (await second).version == 1
        positions = other.execute("SELECT stream_id FROM events ORDER BY position").fetchall()
        assert positions == [("job-a",), ("job-b",)]  # in the order this process asked for them

        third = await store.append_many([Append("job-a", 1, [submitted("job-a")])])  # lock free: at once
        assert third[0].version == 2
    finally:
        other.close()
        await store.close()


async def test_appends_asked_for_at_once_share_one_commit_and_keep_their_own_results(tmp_path):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    commits = []
    real = store._append_many

    def counted(rows, wait=True):
        commits.append(len(rows))
        return real(rows, wait)

    store._append_many = counted
    try:
        results = await asyncio.gather(
            store.append("job-a", 0, [submitted("job-a")]),
            store.append_many(
                [Append("job-b", 0, [submitted("job-b")]), Append("job-c", 0, [submitted("job-c")])]
            ),
            store.append_many(
                [Append("job-a", 0, [submitted("job-a")])]
            ),  # a concurrent writer lost the race
            return_exceptions=True,
        )
        assert commits == [4]  # one transaction for all four appends
        assert results[0].version == 1
        assert [r.version for r in results[1]] == [1, 1]
        assert isinstance(results[2][0], ConcurrencyError) and results[2][0].actual == 1
        rows = store.read_conn.execute("SELECT stream_id FROM events ORDER BY position").fetchall()
        assert rows == [("job-a",), ("job-b",), ("job-c",)]

        await store.append("job-d", 0, [submitted("job-d")])  # alone: a commit of its own
        assert commits == [4, 1]
    finally:
        await store.close()


async def test_the_outbox_query_reads_only_unpublished_events_through_an_index(tmp_path):
    """The relays of every service ask for unpublished events twice a second: on a table of millions of
    published events, a scan would cost each of them seconds."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    queries: list[str] = []
    try:
        for n in range(3):
            await store.append(f"job-{n}", 0, [submitted(f"job-{n}")])
        store.read_conn.set_trace_callback(queries.append)
        assert len(await store.unpublished(older_than=0)) == 3
        store.read_conn.set_trace_callback(None)
        [query] = queries
        plan = store.read_conn.execute("EXPLAIN QUERY PLAN " + query).fetchall()
        steps = [row[-1] for row in plan]
        assert any("USING INDEX" in step for step in steps), steps
        assert not any(step.startswith("SCAN events") and "INDEX" not in step for step in steps), steps
    finally:
        await store.close()


async def test_a_file_of_an_older_release_gains_the_retention_columns(tmp_path):
    """Opened by this release, an events.db made before retention learns when its ended jobs ended."""
    old = sqlite3.connect(tmp_path / "events.db")
    old.executescript(
        "CREATE TABLE projections (stream_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL,"
        " created_at TEXT NOT NULL, version INTEGER NOT NULL, doc TEXT NOT NULL);"
        """INSERT INTO projections VALUES ('done', 't', 'succeeded', '2026-01-01', 5,
           '{"finished_at": "2026-01-02T00:00:00+00:00"}');"""
        "INSERT INTO projections VALUES ('live', 't', 'running', '2026-01-01', 3, '{\"finished_at\": null}');"
    )
    old.close()
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        assert await store.expired(ended_before="2026-01-03") == ["done"]
        assert await store.expired(ended_before="2026-01-01") == []
    finally:
        await store.close()
    again = await SqliteEventStore.open(tmp_path / "events.db")  # a second open changes nothing
    await again.close()
