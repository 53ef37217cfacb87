"""The log store behind one interface; `open_log_store(url)` picks the backend from the event store's URL."""

from gpuyard.shared.settings.common import log_store_url
from gpuyard.shared.stores.logs.base import MAX_CHUNK, NOTE, Chunk, Extent, LogKey, LogStore, split


async def open_log_store(url: str) -> LogStore:
    """`sqlite:///PATH` or `mongodb://HOST/DB`."""
    if url.startswith("sqlite:///"):
        from gpuyard.shared.stores.logs.sqlite import SqliteLogStore

        return await SqliteLogStore.open(url.removeprefix("sqlite:///"))
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from gpuyard.shared.stores.logs.mongo import MongoLogStore

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
