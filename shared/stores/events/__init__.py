"""Event store adapters behind one interface, split by capability; `open_store(url)` picks one from the URL."""

from gpuyard.shared.stores.events.base import (
    Append,
    AppendResult,
    ConcurrencyError,
    EndedJob,
    Outage,
    Page,
    Projection,
    StoreBusy,
    StoredEvent,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StreamKind,
    StreamKindError,
)
from gpuyard.shared.stores.events.documents import DocumentStore
from gpuyard.shared.stores.events.projections import Projections
from gpuyard.shared.stores.events.recorder import EventRecorder
from gpuyard.shared.stores.events.retention import Retention
from gpuyard.shared.stores.events.store import EventStore


async def open_store(
    url: str, *, durable_commits: bool = True, lock_timeout: float | None = None
) -> EventStore:
    """`sqlite:///relative.db` or `sqlite:////absolute/events.db` (embedded default, SQLAlchemy's form),
    or `mongodb://host/db?replicaSet=rs0`. `durable_commits`: SQLite's commits wait for the disk (MongoDB's
    writes always wait for a majority's journal). `lock_timeout`: seconds a SQLite write waits for the lock
    another process holds before it raises StoreBusy (None: `sqlite.LOCK_TIMEOUT_SECONDS`, 30 s); MongoDB
    takes no lock of the whole store."""
    if url.startswith("sqlite:///"):
        from gpuyard.shared.stores.events.sqlite import SqliteEventStore

        return await SqliteEventStore.open(
            url.removeprefix("sqlite:///"), durable_commits=durable_commits, lock_timeout=lock_timeout
        )
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from gpuyard.shared.stores.events.mongo import MongoEventStore

        return await MongoEventStore.open(url)
    raise ValueError(f"unknown event store URL {url!r}: use sqlite:///PATH or mongodb://HOST/DB")


__all__ = [
    "Append",
    "AppendResult",
    "ConcurrencyError",
    "DocumentStore",
    "EndedJob",
    "EventRecorder",
    "EventStore",
    "Outage",
    "Page",
    "Projection",
    "Projections",
    "Retention",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StoredEvent",
    "StreamKind",
    "StreamKindError",
    "open_store",
]
