"""The GPU history in the event store's MongoDB database (`gpuyard.shared.stores.gpuhistory.base`), written by every node's monitor
and read by every submit replica.

Collections (indexes created idempotently on open):
- `gpu_history_raw`: one document per GPU per sample, `_id` {node, gpu, t} (a sample written twice is stored
  once).
- `gpu_history_buckets`: one document per GPU per bucket, `_id` {node, gpu, bucket, t}; besides the point's
  sums, its `version` and `merged`, the times of the raw samples merged into it.
Both have `{node: 1, t: 1}`, `{jobs: 1, t: 1}`, `{tenants: 1, t: 1}` and `{t: 1}` for the routes' reads (a
node's GPUs, a job's, a tenant's usage, every node's) and the compaction's; and a TTL index on `expires`
(`expireAfterSeconds: 0`, each document carries its own expiry, so a changed setting needs no index change):
a bucket expires `keep` after its start, as the compaction drops it; a raw sample `raw_keep` + RAW_GRACE after
its time, a backstop for samples no monitor compacts (the compaction takes them long before).

A compaction never counts a sample twice, whoever runs it and whenever it stops: a bucket document is
replaced only at the version it was read at (`ReplaceOne` on {_id, version}, an upsert: a bucket created or
changed meanwhile makes it a duplicate key, and that bucket is read again and redone), and it takes in only
the samples not in its `merged` yet. The raw samples are deleted after their bucket is written: a monitor
stopped in between leaves them, and the next compaction finds them merged already and only deletes them; two
monitors compacting the same samples serialize on the bucket's version. Until then a read leaves out the raw
samples that their bucket has merged, so a read never counts one twice either.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo import ASCENDING, AsyncMongoClient, IndexModel, ReplaceOne
from pymongo.errors import BulkWriteError

from gpuyard.shared.stores.events.base import StoreUnavailable
from gpuyard.shared.stores.events.mongo import unavailable_on_failure
from gpuyard.shared.stores.gpuhistory.base import (
    COMPACT_BATCH,
    DEFAULT_KEEP,
    DEFAULT_RAW_KEEP,
    ORPHAN_AFTER,
    Compacted,
    GpuHistory,
    GpuPoint,
    HolderUse,
    compact_cutoff,
    merge,
)
from gpuyard.shared.stores.logs.mongo import DUPLICATE_KEY

RAW = "gpu_history_raw"
BUCKETS = "gpu_history_buckets"
RAW_GRACE = 86400.0
"""How long after `raw_keep` a raw sample expires on its own when no compaction has taken it."""
MAX_TRIES = 5
"""Times a compaction redoes a bucket that another writer changed meanwhile; the next compaction goes on."""
INDEXES = [
    IndexModel([("node", ASCENDING), ("t", ASCENDING)], name="node_t"),
    IndexModel([("jobs", ASCENDING), ("t", ASCENDING)], name="jobs_t"),
    IndexModel([("tenants", ASCENDING), ("t", ASCENDING)], name="tenants_t"),
    IndexModel([("t", ASCENDING)], name="t"),
    IndexModel([("expires", ASCENDING)], expireAfterSeconds=0, name="expires"),
]


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _raw_id(node: str, gpu: int, t: float) -> dict[str, Any]:
    """A sample's `_id` (one function builds it: an embedded `_id` matches with its fields in this order)."""
    return {"node": node, "gpu": int(gpu), "t": float(t)}


def _bucket_id(node: str, gpu: int, bucket: float, t: float) -> dict[str, Any]:
    return {"node": node, "gpu": int(gpu), "bucket": float(bucket), "t": float(t)}


def _holder_doc(h: HolderUse) -> dict[str, Any]:
    return {
        "job_id": h.job_id,
        "tenant": h.tenant,
        "user": h.user,
        "fraction": h.fraction,
        "seconds": h.seconds,
        "used": h.used,
    }


def _doc(p: GpuPoint, expires: float) -> dict[str, Any]:
    """A point's document (without `_id`)."""
    return {
        "node": p.node,
        "gpu": int(p.gpu),
        "t": float(p.t),
        "bucket": float(p.bucket),
        "seconds": p.seconds,
        "util": p.utilization_pct,
        "util_seconds": p.util_seconds,
        "mem": p.memory_used_bytes,
        "mem_total": p.memory_total_bytes,
        "holders": [_holder_doc(h) for h in p.holders],
        "jobs": sorted({h.job_id for h in p.holders}),
        "tenants": sorted({h.tenant for h in p.holders}),
        "expires": _at(expires),
    }


def _point(d: dict[str, Any]) -> GpuPoint:
    return GpuPoint(
        node=d["node"],
        gpu=d["gpu"],
        t=d["t"],
        seconds=d["seconds"],
        utilization_pct=d["util"],
        memory_used_bytes=d["mem"],
        memory_total_bytes=d["mem_total"],
        holders=tuple(
            HolderUse(h["job_id"], h["tenant"], h["user"], h["fraction"], h["seconds"], h["used"])
            for h in d["holders"]
        ),
        bucket=d["bucket"],
        util_seconds=d["util_seconds"],
    )


def _duplicates_only(exc: BulkWriteError) -> list[int]:
    """The indexes of the writes refused as duplicates; re-raised when another error is among them, or when
    the writes may not last (no majority acknowledged them)."""
    errors = exc.details.get("writeErrors", [])
    if exc.details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
        raise exc
    return [e["index"] for e in errors]


class MongoGpuHistory(GpuHistory):
    def __init__(
        self, client: AsyncMongoClient, database: str, *, raw_keep: float, keep: float, owns_client: bool
    ):
        self.client = client
        self.db = client[database]
        self.raw = self.db[RAW]
        self.buckets = self.db[BUCKETS]
        self.raw_keep = raw_keep
        self.keep = keep
        """The expiry of a bucket point given to `add` (a compaction's buckets expire after its own `keep`)."""
        self.owns_client = owns_client

    @classmethod
    async def open(
        cls,
        url: str | Path,
        *,
        raw_keep: float = DEFAULT_RAW_KEEP,
        keep: float = DEFAULT_KEEP,
        timeout_ms: int = 5000,
    ) -> MongoGpuHistory:
        """The history of the database of `url` (a `mongodb://` URL: `str | Path` only as `GpuHistory.open`
        takes either), on a client of its own with the event store's durability (a majority's journal)."""
        client: AsyncMongoClient = AsyncMongoClient(
            str(url), serverSelectionTimeoutMS=timeout_ms, tz_aware=True, w="majority", journal=True
        )
        database = client.get_default_database(default="gpuyard").name
        try:
            return await cls._ready(cls(client, database, raw_keep=raw_keep, keep=keep, owns_client=True))
        except StoreUnavailable:
            await client.close()
            raise

    @classmethod
    async def on(
        cls,
        client: AsyncMongoClient,
        database: str,
        *,
        raw_keep: float = DEFAULT_RAW_KEEP,
        keep: float = DEFAULT_KEEP,
    ) -> MongoGpuHistory:
        """On an open client (the event store's), which `close` leaves open."""
        return await cls._ready(cls(client, database, raw_keep=raw_keep, keep=keep, owns_client=False))

    @classmethod
    async def _ready(cls, history: MongoGpuHistory) -> MongoGpuHistory:
        async with unavailable_on_failure("the GPU history: MongoDB creating its indexes"):
            await history.raw.create_indexes(INDEXES)
            await history.buckets.create_indexes(INDEXES)
        return history

    async def add(self, points: list[GpuPoint]) -> None:
        raw = [
            {"_id": _raw_id(p.node, p.gpu, p.t), **_doc(p, p.t + self.raw_keep + RAW_GRACE)}
            for p in points
            if not p.bucket
        ]
        buckets = [
            {
                "_id": _bucket_id(p.node, p.gpu, p.bucket, p.t),
                **_doc(p, p.t + self.keep),
                "version": 1,
                "merged": [],
            }
            for p in points
            if p.bucket
        ]
        async with unavailable_on_failure("the GPU history: MongoDB writing samples"):
            for collection, docs in ((self.raw, raw), (self.buckets, buckets)):
                if not docs:
                    continue
                try:
                    await collection.insert_many(docs, ordered=False)
                except BulkWriteError as exc:
                    _duplicates_only(exc)  # (those stored already are kept as they were)

    async def compact(
        self,
        *,
        now: float,
        raw_keep: float,
        bucket: float,
        keep: float,
        node: str | None = None,
        limit: int = COMPACT_BATCH,
    ) -> Compacted:
        cutoff = compact_cutoff(now, raw_keep, bucket)
        query: dict[str, Any] = {"t": {"$lt": cutoff}}
        if node is not None:
            query["$or"] = [{"node": node}, {"t": {"$lt": cutoff - ORPHAN_AFTER}}]
        async with unavailable_on_failure("the GPU history: MongoDB compacting"):
            found = self.raw.find(query, sort=[("t", ASCENDING)], limit=limit)
            raw = [_point(d) async for d in found]
            groups: dict[tuple[str, int, float], list[GpuPoint]] = {}
            for p in raw:
                groups.setdefault((p.node, p.gpu, math.floor(p.t / bucket) * bucket), []).append(p)
            unsettled = await self._merge(groups, bucket=bucket, keep=keep)
            settled = [p for p in raw if (p.node, p.gpu, math.floor(p.t / bucket) * bucket) not in unsettled]
            if settled:
                await self.raw.delete_many({"_id": {"$in": [_raw_id(p.node, p.gpu, p.t) for p in settled]}})
            old = {"t": {"$lt": now - keep}}
            dropped = (await self.raw.delete_many(old)).deleted_count
            dropped += (await self.buckets.delete_many(old)).deleted_count
        return Compacted(merged=len(settled), dropped=dropped)

    async def _merge(
        self, groups: dict[tuple[str, int, float], list[GpuPoint]], *, bucket: float, keep: float
    ) -> set[tuple[str, int, float]]:
        """Each group's raw points into its bucket, each once; the groups still not settled after MAX_TRIES
        (their raw points stay for the next compaction)."""
        pending = groups
        for _ in range(MAX_TRIES):
            if not pending:
                return set()
            ids = [_bucket_id(node, gpu, bucket, t) for node, gpu, t in pending]
            held = {(d["node"], d["gpu"], d["t"]): d async for d in self.buckets.find({"_id": {"$in": ids}})}
            keys, writes = [], []
            for key, new in pending.items():
                doc = held.get(key)
                done = set(doc["merged"]) if doc else set()
                fresh = [p for p in new if p.t not in done]
                if not fresh:
                    continue  # (merged already, by a compaction that stopped before deleting them)
                point = merge(([_point(doc)] if doc else []) + fresh, t=key[2], bucket=bucket)
                version = doc["version"] if doc else 0
                replacement = {
                    "_id": _bucket_id(*key[:2], bucket, key[2]),
                    **_doc(point, key[2] + keep),
                    "version": version + 1,
                    "merged": sorted(done | {p.t for p in fresh}),
                }
                keys.append(key)
                writes.append(
                    ReplaceOne({"_id": replacement["_id"], "version": version}, replacement, upsert=True)
                )
            if not writes:
                return set()
            try:
                await self.buckets.bulk_write(writes, ordered=False)
                return set()
            except BulkWriteError as exc:  # changed meanwhile: read again and redo those
                pending = {keys[i]: pending[keys[i]] for i in _duplicates_only(exc)}
        return set(pending)

    async def points(
        self,
        *,
        since: float,
        until: float | None = None,
        node: str | None = None,
        job_id: str | None = None,
        tenant: str | None = None,
    ) -> list[GpuPoint]:
        query: dict[str, Any] = {"t": {"$gte": since} | ({"$lt": until} if until is not None else {})}
        if node is not None:
            query["node"] = node
        if job_id is not None:
            query["jobs"] = job_id
        if tenant is not None:
            query["tenants"] = tenant
        async with unavailable_on_failure("the GPU history: MongoDB reading"):
            raw = [_point(d) async for d in self.raw.find(query, projection={"expires": 0})]
            found = self.buckets.find(query, projection={"merged": 0, "expires": 0})
            buckets = [_point(d) async for d in found]
            raw = await self._not_merged(raw, buckets)
        return sorted(raw + buckets, key=lambda p: (p.t, p.node, p.gpu))

    async def _not_merged(self, raw: list[GpuPoint], buckets: list[GpuPoint]) -> list[GpuPoint]:
        """The raw points less those their bucket has merged already (a compaction between its two writes)."""
        if not raw or not buckets:
            return raw
        sizes = {b.bucket for b in buckets}
        end = max(b.t + b.bucket for b in buckets)
        covering = {(p.node, p.gpu, s, math.floor(p.t / s) * s) for p in raw if p.t < end for s in sizes}
        if not covering:
            return raw
        ids = [_bucket_id(*key) for key in covering]
        merged: set[tuple[str, int, float]] = set()
        found = self.buckets.find({"_id": {"$in": ids}}, projection={"node": 1, "gpu": 1, "merged": 1})
        async for d in found:
            merged.update((d["node"], d["gpu"], t) for t in d["merged"])
        return [p for p in raw if (p.node, p.gpu, p.t) not in merged]

    async def count(self) -> dict[float, int]:
        async with unavailable_on_failure("the GPU history: MongoDB counting"):
            counts = {0.0: await self.raw.count_documents({})}
            grouped = await self.buckets.aggregate([{"$group": {"_id": "$bucket", "n": {"$sum": 1}}}])
            counts |= {float(d["_id"]): int(d["n"]) async for d in grouped}
        return {b: n for b, n in counts.items() if n}

    async def close(self) -> None:
        if self.owns_client:
            await self.client.close()
