"""The event store's durability settings (docs/operations.md, "What GPUYARD guarantees"): SQLite in WAL mode
with synchronous=FULL (a commit is on disk before a 202 promises the job), MongoDB with majority, journaled
writes."""

from __future__ import annotations

import asyncio

import pytest
from pymongo import WriteConcern

from gpuyard.shared.stores.events import StoreUnavailable, open_store
from gpuyard.shared.stores.events import mongo as mongo_store

FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA


def test_sqlite_is_wal_with_synchronous_full(tmp_path):
    async def pragmas():
        store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
        try:
            return [
                (
                    conn.execute("PRAGMA journal_mode").fetchone()[0],
                    conn.execute("PRAGMA synchronous").fetchone()[0],
                )
                for conn in (store._conn, store._read_conn)
            ]
        finally:
            await store.close()

    assert asyncio.run(pragmas()) == [("wal", FULL), ("wal", FULL)]


def test_mongo_writes_with_majority_and_journal(monkeypatch):
    """Without a server: the client the store makes carries the write concern (it is the default of every
    collection and of the transactions' sessions)."""
    made: list = []

    class Recording(mongo_store.AsyncMongoClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(mongo_store, "AsyncMongoClient", Recording)
    with pytest.raises(StoreUnavailable):  # nothing listens there
        asyncio.run(mongo_store.MongoEventStore.open("mongodb://127.0.0.1:9/gpuyard", timeout_ms=100))
    [client] = made
    assert client.write_concern == WriteConcern(w="majority", j=True)
    assert client["gpuyard"]["events"].write_concern == WriteConcern(w="majority", j=True)
