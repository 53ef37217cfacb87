"""Event store adapters behind one interface; `open_store(url)` picks one from the URL."""

from shared.store.base import (
    Append,
    AppendResult,
    ConcurrencyError,
    EndedJob,
    EventStore,
    Page,
    Projection,
    StoredEvent,
    StoreError,
    StoreUnavailable,
)


async def open_store(url: str, *, durable_commits: bool = True) -> EventStore:
    """`sqlite:///relative.db` or `sqlite:////absolute/events.db` (embedded default, SQLAlchemy's form),
    or `mongodb://host/db?replicaSet=rs0`. `durable_commits`: SQLite's commits wait for the disk (MongoDB's
    writes always wait for a majority's journal)."""
    if url.startswith("sqlite:///"):
        from shared.store.sqlite import SqliteEventStore

        return await SqliteEventStore.open(url.removeprefix("sqlite:///"), durable_commits=durable_commits)
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from shared.store.mongo import MongoEventStore

        return await MongoEventStore.open(url)
    raise ValueError(f"unknown event store URL {url!r}: use sqlite:///PATH or mongodb://HOST/DB")


__all__ = [
    "Append",
    "AppendResult",
    "ConcurrencyError",
    "EndedJob",
    "EventStore",
    "Page",
    "Projection",
    "StoreError",
    "StoreUnavailable",
    "StoredEvent",
    "open_store",
]
