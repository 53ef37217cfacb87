"""The MongoDB event store (PyMongo's async API, `AsyncMongoClient`), for a replica set at scale.

Collections (their indexes, created idempotently on open, and the migration of an older database are in
`mongoschema.py`):
- `events`: one document per event, `_id` = event id (a repeated append of the same event is recognised), with
  its stream's id, version and kind.
- `projections`: one document per stream, `_id` = stream id, with its stream's kind, which every query filters
  on.
- `documents`: state one writer replaces whole (`put_document`: the queue's line), `_id` = its key.
- `schema`: the version of the database's schema (`mongoschema.migrate`).

On a replica set the events and the projection are written in one multi-document transaction; on a
standalone server (no transactions) the projection is written after the events, guarded by its version so
that a late writer never moves it backwards.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.stores.events.base import (
    AppendResult,
    ConcurrencyError,
    EndedJob,
    Order,
    Page,
    Projection,
    StoredEvent,
    StoreUnavailable,
    StreamKind,
    StreamKindError,
    decode_cursor,
    encode_cursor,
)
from gpuyard.shared.stores.events.mongoschema import EVENT_INDEXES, PROJECTION_INDEXES, migrate
from gpuyard.shared.stores.events.store import EventStore

JOB = StreamKind.JOB.value


@contextlib.asynccontextmanager
async def unavailable_on_failure(what: str) -> AsyncIterator[None]:
    """A PyMongoError (no server, no primary, a command refused) as StoreUnavailable saying what failed
    ("`what` failed: why"): the API answers it with a 503 and a service waits it out (`gpuyard.shared.runtime.service`), as
    for the embedded stores. Also a decorator, for a whole method."""
    try:
        yield
    except PyMongoError as exc:
        raise StoreUnavailable(f"{what} failed: {exc}") from exc


def _filters(
    kind: StreamKind,
    states: list[str] | None,
    tenant: str | None,
    user: str | None,
    name: str | None,
    search: str | None,
) -> dict[str, Any]:
    """The query of a listing's filters (`Projections.list_projections`)."""
    query: dict[str, Any] = {"kind": kind.value}
    if states:
        query["state"] = {"$in": states}
    if tenant is not None:
        query["tenant"] = tenant
    if user is not None:
        query["doc.user"] = user
    if name is not None:
        query["doc.name"] = name
    if search:
        anywhere = {"$regex": re.escape(search), "$options": "i"}  # (a literal text, any case)
        query["$or"] = [{field: anywhere} for field in ("_id", "doc.name", "doc.user", "tenant")]
    return query


class MongoEventStore(EventStore):
    def __init__(self, client: AsyncMongoClient, database: str):
        self.client = client
        self.db = client[database]
        self.events = self.db["events"]
        self.projections = self.db["projections"]
        self.documents = self.db["documents"]
        self.transactions = False

    @classmethod
    async def open(cls, url: str, *, timeout_ms: int = 5000) -> MongoEventStore:
        client: AsyncMongoClient = AsyncMongoClient(
            url, serverSelectionTimeoutMS=timeout_ms, tz_aware=True, w="majority", journal=True
        )
        database = client.get_default_database(default="gpuyard").name
        store = cls(client, database)
        try:
            hello = await client.admin.command("hello")
            store.transactions = "setName" in hello
            await migrate(store.db)
            await store.events.create_indexes(EVENT_INDEXES)
            await store.projections.create_indexes(PROJECTION_INDEXES)
        except PyMongoError as exc:
            await client.close()
            raise StoreUnavailable(f"cannot reach MongoDB at {url}: {exc}") from exc
        return store

    @unavailable_on_failure("MongoDB append")
    async def append(
        self,
        stream_id: str,
        expected_version: int,
        events: list[CloudEvent],
        projection: Projection | None = None,
        *,
        kind: StreamKind = StreamKind.JOB,
    ) -> AppendResult:
        now = time.time()
        docs = [
            {
                "_id": e.id,
                "stream_id": stream_id,
                "version": expected_version + i,
                "type": e.type,
                "event": e.to_dict(),
                "recorded_at": now,
                "published": False,
                "kind": kind.value,
            }
            for i, e in enumerate(events, 1)
        ]

        async def write(session=None) -> AppendResult:
            ids = [d["_id"] for d in docs]
            known = await self.events.count_documents({"_id": {"$in": ids}}, session=session)
            current, held = await self._last(stream_id, session)
            if known == len(ids):
                return AppendResult(version=current, duplicate=True)
            if held is not None and held != kind:
                raise StreamKindError(stream_id, kind, held)
            if current != expected_version or known:
                raise ConcurrencyError(stream_id, expected_version, current)
            try:
                await self.events.insert_many(docs, ordered=True, session=session)
            except (BulkWriteError, DuplicateKeyError) as exc:
                raise ConcurrencyError(
                    stream_id, expected_version, (await self._last(stream_id, None))[0]
                ) from exc
            if projection is not None:
                await self._put_projection(projection, kind, session)
            return AppendResult(version=expected_version + len(docs))

        if not self.transactions:
            return await write()
        async with self.client.start_session() as session:
            return await session.with_transaction(write)

    async def _last(self, stream_id: str, session) -> tuple[int, str | None]:
        """The stream's version and kind (0 and None: no stream)."""
        last = await self.events.find_one(
            {"stream_id": stream_id},
            sort=[("version", DESCENDING)],
            projection={"version": 1, "kind": 1},
            session=session,
        )
        return (int(last["version"]), last.get("kind", JOB)) if last else (0, None)

    async def _put_projection(self, p: Projection, kind: StreamKind, session) -> None:
        fields = {
            "kind": kind.value,
            "tenant": p.tenant,
            "state": p.state,
            "version": p.version,
            "doc": p.doc_dict(),
            "ended_at": p.ended_at,
        }
        with contextlib.suppress(DuplicateKeyError):  # a newer projection is already there
            await self.projections.update_one(
                {
                    "_id": p.stream_id,
                    "$or": [{"version": {"$lt": p.version}}, {"version": {"$exists": False}}],
                },
                {"$set": fields, "$setOnInsert": {"created_at": p.created_at}},
                upsert=True,
                session=session,
            )

    @unavailable_on_failure("MongoDB marking events published")
    async def mark_published(self, event_ids: list[str]) -> None:
        if event_ids:
            await self.events.update_many({"_id": {"$in": event_ids}}, {"$set": {"published": True}})

    @unavailable_on_failure("MongoDB reading a stream")
    async def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        query = {"stream_id": stream_id, "version": {"$gt": after_version}}
        cursor = self.events.find(query).sort("version", ASCENDING)
        return [
            StoredEvent(stream_id, d["version"], CloudEvent.model_validate(d["event"])) async for d in cursor
        ]

    @unavailable_on_failure("MongoDB reading a projection")
    async def get_projection(
        self, stream_id: str, *, kind: StreamKind = StreamKind.JOB
    ) -> dict[str, Any] | None:
        doc = await self.projections.find_one({"_id": stream_id, "kind": kind.value})
        return doc["doc"] if doc else None

    @unavailable_on_failure("MongoDB listing projections")
    async def list_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        order: Order = "newest",
        limit: int = 50,
        cursor: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> Page:
        query = _filters(kind, states, tenant, user, name, search)
        if cursor:
            created_at, stream_id = decode_cursor(cursor, order)
            after = "$lt" if order == "newest" else "$gt"
            query = {
                "$and": [
                    query,
                    {
                        "$or": [
                            {"created_at": {after: created_at}},
                            {"created_at": created_at, "_id": {after: stream_id}},
                        ]
                    },
                ]
            }
        direction = DESCENDING if order == "newest" else ASCENDING
        found = (
            self.projections.find(query)
            .sort([("created_at", direction), ("_id", direction)])
            .limit(limit + 1)
        )
        docs = await found.to_list()
        page = Page(items=[d["doc"] for d in docs[:limit]])
        if len(docs) > limit:
            page.next_cursor = encode_cursor(docs[limit - 1]["created_at"], docs[limit - 1]["_id"], order)
        return page

    @unavailable_on_failure("MongoDB counting projections")
    async def count_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> int:
        return await self.projections.count_documents(_filters(kind, states, tenant, user, name, search))

    @unavailable_on_failure("MongoDB reading projections' versions")
    async def versions(self, *, states: list[str], created_before: str | None = None) -> dict[str, int]:
        query: dict[str, Any] = {"kind": JOB, "state": {"$in": states}}
        if created_before is not None:  # (on `kind_state_newest`)
            query["created_at"] = {"$lt": created_before}
        found = self.projections.find(query, projection={"version": 1})
        return {d["_id"]: int(d["version"]) async for d in found}

    @unavailable_on_failure("MongoDB writing a document")
    async def put_document(self, key: str, doc: dict[str, Any]) -> None:
        await self.documents.replace_one({"_id": key}, {"_id": key, "doc": doc}, upsert=True)

    @unavailable_on_failure("MongoDB reading a document")
    async def get_document(self, key: str) -> dict[str, Any] | None:
        found = await self.documents.find_one({"_id": key})
        return found["doc"] if found else None

    @unavailable_on_failure("MongoDB reading the ended jobs")
    async def ended_since(self, after: str, *, limit: int = 1000) -> list[EndedJob]:
        fields = {"tenant": 1, "state": 1, "ended_at": 1, "created_at": 1}
        fields |= {"doc.attempts.queued_at": 1, "doc.attempts.started_at": 1}
        found = (
            self.projections.find(
                {"ended_at": {"$ne": None, "$gte": after}, "compacted": {"$ne": True}, "kind": JOB}, fields
            )
            .sort([("ended_at", ASCENDING), ("_id", ASCENDING)])  # (on `ended`)
            .limit(limit)
        )
        out = []
        for d in await found.to_list():
            first = (d.get("doc", {}).get("attempts") or [{}])[0]
            out.append(
                EndedJob(
                    stream_id=d["_id"],
                    tenant=d["tenant"],
                    state=d["state"],
                    ended_at=d["ended_at"],
                    submitted_at=first.get("queued_at") or d["created_at"],
                    started_at=first.get("started_at"),
                )
            )
        return out

    @unavailable_on_failure("MongoDB counting projections by tenant")
    async def count_by_tenant(self, *, states: list[str]) -> dict[str, int]:
        pipeline: list[dict[str, Any]] = [
            {"$match": {"kind": JOB, "state": {"$in": states}}},
            {"$group": {"_id": "$tenant", "n": {"$sum": 1}}},
        ]
        return {d["_id"]: int(d["n"]) async for d in await self.projections.aggregate(pipeline)}

    @unavailable_on_failure("MongoDB finding each tenant's oldest projection")
    async def oldest_by_tenant(self, *, states: list[str]) -> dict[str, str]:
        pipeline: list[dict[str, Any]] = [
            {"$match": {"kind": JOB, "state": {"$in": states}}},
            {"$group": {"_id": "$tenant", "oldest": {"$min": "$created_at"}}},
        ]
        return {d["_id"]: d["oldest"] async for d in await self.projections.aggregate(pipeline)}

    @unavailable_on_failure("MongoDB finding ids by prefix")
    async def ids_starting(self, prefix: str, *, tenant: str | None = None, limit: int = 10) -> list[str]:
        query: dict[str, Any] = {
            "_id": {"$regex": f"^{re.escape(prefix)}"},
            "kind": JOB,
        }  # (anchored: on _id)
        if tenant is not None:
            query["tenant"] = tenant
        found = self.projections.find(query, projection={"_id": 1}).sort("_id", ASCENDING).limit(limit)
        return [d["_id"] async for d in found]

    @unavailable_on_failure("MongoDB reading the outbox")
    async def unpublished(self, *, older_than: float, limit: int = 500) -> list[CloudEvent]:
        cutoff = time.time() - older_than
        found = self.events.find({"published": False, "recorded_at": {"$lte": cutoff}}).sort("recorded_at", 1)
        return [CloudEvent.model_validate(d["event"]) for d in await found.limit(limit).to_list()]

    @unavailable_on_failure("MongoDB finding the streams to compact")
    async def expired(self, *, ended_before: str, limit: int = 500) -> list[str]:
        found = (
            self.projections.find(
                {"ended_at": {"$ne": None, "$lt": ended_before}, "compacted": {"$ne": True}, "kind": JOB},
                {"_id": 1},
            )
            .sort("ended_at", ASCENDING)
            .limit(limit)
        )
        return [d["_id"] for d in await found.to_list()]

    @unavailable_on_failure("MongoDB compaction")
    async def compact(self, stream_id: str) -> int:
        async def write(session=None) -> int:
            p = await self.projections.find_one({"_id": stream_id, "kind": JOB}, session=session)
            if p is None or p.get("ended_at") is None or p.get("compacted"):
                return 0
            unpublished = await self.events.count_documents(
                {"stream_id": stream_id, "published": False}, session=session
            )
            if unpublished:
                return 0
            deleted = await self.events.delete_many(
                {"stream_id": stream_id, "version": {"$gt": 1, "$lt": p["version"]}}, session=session
            )
            await self.projections.update_one(
                {"_id": stream_id}, {"$set": {"compacted": True}}, session=session
            )
            return deleted.deleted_count

        if not self.transactions:
            return await write()
        async with self.client.start_session() as session:
            return await session.with_transaction(write)

    async def close(self) -> None:
        await self.client.close()
