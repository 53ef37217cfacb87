"""The MongoDB event store's indexes, and the migration that brings a database made by an older release up to
this one's: guarded by a schema-version document (collection `schema`, `_id` `event-store`), written last, so
that a store that opens the database again does nothing; each step changes only what it has not changed yet,
so that a migration cut short (or run by two services at once) runs again safely.

- `events`: `{stream_id: 1, version: 1}` unique (optimistic concurrency: a second writer of one version fails),
  `{published: 1, recorded_at: 1}` partial on `published: false` (the outbox).
- `projections`: `{kind: 1, created_at: -1, _id: -1}`, `{kind: 1, tenant: 1, created_at: -1}`,
  `{kind: 1, state: 1, created_at: -1}` for listing one kind's newest first (or oldest first),
  `{kind: 1, state: 1, tenant: 1, created_at: 1}` for counting and the oldest per tenant, `{ended_at: 1}` for
  retention (`expired`: the ended jobs to compact, whose middle events `compact` deletes) and the feed of ends
  (`ended_since`).
"""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure

from gpuyard.shared.stores.events.base import StreamKind
from gpuyard.shared.stores.events.kindbackfill import (
    ID_PREFIXES,
    NODE_CONTROL,
    NODE_FLAGS,
    NODE_READY,
    RENAMED_STATES,
    id_range,
)

SCHEMA_VERSION = 2
"""1: the streams told apart by their ids and states; 2: each stream's kind stored with it (`StreamKind`)."""
SCHEMA_ID = "event-store"
EVENT_INDEXES = [
    IndexModel([("stream_id", ASCENDING), ("version", ASCENDING)], unique=True, name="stream_version"),
    IndexModel(
        [("published", ASCENDING), ("recorded_at", ASCENDING)],
        partialFilterExpression={"published": False},
        name="outbox",
    ),
]
PROJECTION_INDEXES = [
    IndexModel([("kind", ASCENDING), ("created_at", DESCENDING), ("_id", DESCENDING)], name="kind_newest"),
    IndexModel(
        [("kind", ASCENDING), ("tenant", ASCENDING), ("created_at", DESCENDING)], name="kind_tenant_newest"
    ),
    IndexModel(
        [("kind", ASCENDING), ("state", ASCENDING), ("created_at", DESCENDING)], name="kind_state_newest"
    ),
    IndexModel(
        [("kind", ASCENDING), ("state", ASCENDING), ("tenant", ASCENDING), ("created_at", ASCENDING)],
        name="kind_state_tenant_created",
    ),
    IndexModel([("ended_at", ASCENDING)], name="ended"),
]
FORMER_INDEXES = ["newest", "tenant_newest", "state_newest", "state_tenant_created", "state_tenant"]
"""The projections' indexes of schema 1, each replaced by one that begins with `kind`."""
NOT_FOUND = (26, 27)
"""NamespaceNotFound, IndexNotFound: an index dropped already."""
UNKINDED: dict[str, Any] = {"kind": {"$exists": False}}


async def migrate(db: AsyncDatabase) -> bool:
    """Bring the database to SCHEMA_VERSION, then say so in its schema document; True when it ran."""
    schema = db["schema"]
    found = await schema.find_one({"_id": SCHEMA_ID})
    if found is not None and found.get("version", 1) >= SCHEMA_VERSION:
        return False
    await add_kinds(db)
    await schema.update_one({"_id": SCHEMA_ID}, {"$set": {"version": SCHEMA_VERSION}}, upsert=True)
    return True


async def add_kinds(db: AsyncDatabase) -> None:
    """Schema 1 to 2: each projection's kind from its state, those states renamed (`kindbackfill.py`), each
    event's kind from its stream's id, and the indexes of schema 1 dropped (those of 2 are made on open)."""
    projections, events = db["projections"], db["events"]
    for old, (kind, new) in RENAMED_STATES.items():
        await projections.update_many(
            {**UNKINDED, "state": old}, {"$set": {"kind": kind.value, "state": new}}
        )
    node = StreamKind.NODE.value
    for flag, state in NODE_FLAGS:
        flagged = {**UNKINDED, "state": NODE_CONTROL, f"doc.{flag}": True}
        await projections.update_many(flagged, {"$set": {"kind": node, "state": state}})
    await projections.update_many(
        {**UNKINDED, "state": NODE_CONTROL}, {"$set": {"kind": node, "state": NODE_READY}}
    )
    await projections.update_many(UNKINDED, {"$set": {"kind": StreamKind.JOB.value}})
    for prefix, kind in ID_PREFIXES.items():
        start, end = id_range(prefix)
        ids = {**UNKINDED, "stream_id": {"$gte": start, "$lt": end}}
        await events.update_many(ids, {"$set": {"kind": kind.value}})
    await events.update_many(UNKINDED, {"$set": {"kind": StreamKind.JOB.value}})
    for name in FORMER_INDEXES:
        try:
            await projections.drop_index(name)
        except OperationFailure as exc:
            if exc.code not in NOT_FOUND:
                raise
