"""The log store behind one interface; `open_log_store(url)` picks the backend from the event store's URL."""

from pathlib import Path

from gpuyard.shared.logstore.base import MAX_CHUNK, NOTE, Chunk, Extent, LogKey, LogStore, split


def log_store_url(store_url: str) -> str:
    """The log store beside an event store: `logs.db` next to the SQLite file, or the same MongoDB database."""
    if store_url.startswith("sqlite:///"):
        return f"sqlite:///{Path(store_url.removeprefix('sqlite:///')).with_name('logs.db')}"
    return store_url


async def open_log_store(url: str) -> LogStore:
    """`sqlite:///PATH` or `mongodb://HOST/DB`."""
    if url.startswith("sqlite:///"):
        from gpuyard.shared.logstore.sqlite import SqliteLogStore

        return await SqliteLogStore.open(url.removeprefix("sqlite:///"))
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from gpuyard.shared.logstore.mongo import MongoLogStore

        return await MongoLogStore.open(url)
    raise ValueError(f"unknown log store URL {url!r}: use sqlite:///PATH or mongodb://HOST/DB")


__all__ = [
    "MAX_CHUNK",
    "NOTE",
    "Chunk",
    "Extent",
    "LogKey",
    "LogStore",
    "log_store_url",
    "open_log_store",
    "split",
]
