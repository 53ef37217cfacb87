"""The MongoDB log store (PyMongo's async API): collection `log_chunks`, one document per chunk (its offset,
end and bytes), unique on (job_id, attempt, replica, offset) so that a chunk sent twice is stored once. Every
executor and API instance of a cluster reads and writes the same collection."""

from __future__ import annotations

from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.errors import BulkWriteError, PyMongoError

from gpuyard.shared.stores.events.base import StoreUnavailable
from gpuyard.shared.stores.events.mongo import unavailable_on_failure
from gpuyard.shared.stores.logs.base import MAX_CHUNK, Chunk, Extent, LogKey, LogStore, cut

INDEXES = [
    IndexModel(
        [("job_id", ASCENDING), ("attempt", ASCENDING), ("replica", ASCENDING), ("offset", ASCENDING)],
        unique=True,
        name="replica_offset",
    )
]
DUPLICATE_KEY = 11000


class MongoLogStore(LogStore):
    def __init__(self, client: AsyncMongoClient, database: str):
        self.client = client
        self.chunks = client[database]["log_chunks"]

    @classmethod
    async def open(cls, url: str, *, timeout_ms: int = 5000) -> MongoLogStore:
        client: AsyncMongoClient = AsyncMongoClient(url, serverSelectionTimeoutMS=timeout_ms)
        store = cls(client, client.get_default_database(default="gpuyard").name)
        try:
            await store.chunks.create_indexes(INDEXES)
        except PyMongoError as exc:
            await client.close()
            raise StoreUnavailable(f"cannot reach MongoDB at {url}: {exc}") from exc
        return store

    @unavailable_on_failure("MongoDB writing log chunks")
    async def append(self, chunks: list[Chunk]) -> None:
        if not chunks:
            return
        if any(len(c.data) > MAX_CHUNK for c in chunks):
            raise ValueError(f"a log chunk holds at most {MAX_CHUNK} bytes")
        docs = [{**_match(c.key), "offset": c.offset, "end": c.end, "data": c.data} for c in chunks]
        try:
            await self.chunks.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            if any(e.get("code") != DUPLICATE_KEY for e in exc.details.get("writeErrors", [])):
                raise

    @unavailable_on_failure("MongoDB reading a log's extent")
    async def extent(self, key: LogKey) -> Extent | None:
        first = await self.chunks.find_one(_match(key), sort=[("offset", ASCENDING)])
        if first is None:
            return None
        last = await self.chunks.find_one(_match(key), sort=[("offset", -1)])
        if last is None:  # (the job's log deleted between the two reads)
            return None
        return Extent(first["offset"], last["end"])

    @unavailable_on_failure("MongoDB reading a log")
    async def read(self, key: LogKey, start: int, end: int) -> list[Chunk]:
        cursor = self.chunks.find(
            {**_match(key), "end": {"$gt": start}, "offset": {"$lt": end}}, sort=[("offset", ASCENDING)]
        )
        return cut([Chunk(key, d["offset"], bytes(d["data"])) async for d in cursor], start, end)

    @unavailable_on_failure("MongoDB listing a job's logs")
    async def keys(self, job_id: str) -> list[LogKey]:
        pairs = await self.chunks.aggregate(
            [
                {"$match": {"job_id": job_id}},
                {"$group": {"_id": {"attempt": "$attempt", "replica": "$replica"}}},
            ]
        )
        found = [LogKey(job_id, d["_id"]["attempt"], d["_id"]["replica"]) async for d in pairs]
        return sorted(found)

    @unavailable_on_failure("MongoDB trimming a log")
    async def trim(self, key: LogKey, before: int) -> None:
        await self.chunks.delete_many({**_match(key), "end": {"$lte": before}})

    @unavailable_on_failure("MongoDB deleting a job's logs")
    async def delete_job(self, job_id: str) -> None:
        await self.chunks.delete_many({"job_id": job_id})

    async def close(self) -> None:
        await self.client.close()


def _match(key: LogKey) -> dict:
    return {"job_id": key.job_id, "attempt": key.attempt, "replica": key.replica}
