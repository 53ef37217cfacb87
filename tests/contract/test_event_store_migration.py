"""A store made before streams had a kind, opened by this release: migrated once, in place, and then every read
model and every query of jobs reads it right (the embedded store, and MongoDB's on the stand-in, as a replica
set and standalone, and on a real server where `tests/contract/conftest.py` finds or starts one).

The old store is written here as that release wrote it: its tables (SQLite) with raw SQL, its collections
(MongoDB) as raw documents, the other kinds' streams told apart by their ids' prefixes (`model:`, `/alerts/`,
`/nodes/`, `/idle/`) and their projections' states (`model`, `model-public`, `model-removed`, `alert-active`,
`alert-resolved`, `node-control`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel

from gpuyard.shared.contracts.events.alerts import (
    AlertKind,
    AlertRaised,
    AlertResolved,
    IdleStop,
    IdleWarning,
)
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, make_event
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobSubmitted
from gpuyard.shared.contracts.events.models import ModelDeleted, ModelPublished
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, NodeAction, NodeControlChanged
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, JobView, apply
from gpuyard.shared.stores.events import EventStore, StreamKind, open_store
from gpuyard.shared.stores.events.mongoschema import FORMER_INDEXES, PROJECTION_INDEXES, SCHEMA_VERSION
from gpuyard.shared.stores.events.sqlite import SqliteEventStore
from gpuyard.shared.stores.ledger import JobLedger, projection_of
from gpuyard.shared.stores.readmodels import alertbook, idlebook, modelregistry, nodecontrol
from gpuyard.shared.stores.readmodels.alertbook import AlertBook, AlertView, list_alerts
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry
from gpuyard.shared.stores.readmodels.queueline import LINE_KEY, LineReader, line_doc
from tests.contract.conftest import EVENT_STORE_BACKENDS, SQLITE, fresh_database

QUEUED, ENDED = "0123456789abcdef", "fedcba9876543210"
ACTIVE_ALERT, RESOLVED_ALERT = "gpu_idle/node-a/0", "gpu_idle/node-b/1"
T0 = datetime(2026, 3, 1, tzinfo=UTC)
EVERY_JOB_STATE = [s.value for s in JobState]

OLD_SQLITE_SCHEMA = """
CREATE TABLE events (
    position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, version INTEGER NOT NULL,
    event_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, data TEXT NOT NULL, recorded_at REAL NOT NULL,
    published INTEGER NOT NULL DEFAULT 0, UNIQUE (stream_id, version)
);
CREATE INDEX events_unpublished ON events (position) WHERE published = 0;
CREATE TABLE projections (
    stream_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, created_at TEXT NOT NULL,
    version INTEGER NOT NULL, doc TEXT NOT NULL, ended_at TEXT, compacted INTEGER NOT NULL DEFAULT 0,
    user TEXT, name TEXT
);
CREATE INDEX projections_tenant ON projections (tenant, created_at DESC);
CREATE INDEX projections_created ON projections (created_at DESC, stream_id DESC);
CREATE INDEX projections_state_tenant_created ON projections (state, tenant, created_at);
CREATE TABLE documents (key TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE INDEX projections_expiring ON projections (ended_at) WHERE compacted = 0 AND ended_at IS NOT NULL;
CREATE INDEX projections_state_listing ON projections (state, created_at, stream_id, tenant, user, name);
"""
"""The embedded store's schema as the release before kinds made it (every column of its migrations in)."""
OLD_MONGO_INDEXES = [
    IndexModel([("created_at", DESCENDING), ("_id", DESCENDING)], name="newest"),
    IndexModel([("tenant", ASCENDING), ("created_at", DESCENDING)], name="tenant_newest"),
    IndexModel([("state", ASCENDING), ("created_at", DESCENDING)], name="state_newest"),
    IndexModel(
        [("state", ASCENDING), ("tenant", ASCENDING), ("created_at", ASCENDING)], name="state_tenant_created"
    ),
    IndexModel([("ended_at", ASCENDING)], name="ended"),
]


@dataclass
class OldStream:
    """One stream as the release before kinds stored it; `state` None: no projection."""

    stream_id: str
    events: list[CloudEvent]
    state: str | None = None
    tenant: str = ""
    doc: dict[str, Any] | None = None
    created_at: str = ""
    ended_at: str | None = None


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def event(data: EventData, minute: int, event_id: str | None = None) -> CloudEvent:
    return make_event(data, source="/old", id=event_id, time=at(minute))


def job_stream(events: list[CloudEvent]) -> OldStream:
    view: JobView | None = None
    for version, e in enumerate(events, 1):
        view = apply(view, e, version=version)
    assert view is not None
    p = projection_of(view)
    return OldStream(p.stream_id, events, p.state, p.tenant, p.doc_dict(), p.created_at, p.ended_at)


def model_stream(tenant: str, name: str, datas: list[EventData], minute: int) -> OldStream:
    view, events = None, []
    for version, data in enumerate(datas, 1):
        events.append(event(data, minute + version))
        view = modelregistry.apply(view, events[-1], version)
    assert view is not None
    state = "model-public" if view.public else "model" if view.versions else "model-removed"
    doc = view.model_dump(mode="json")
    return OldStream(f"model:{tenant}:{name}", events, state, tenant, doc, view.created_at.isoformat())


def published(tenant: str, name: str, public: bool = False) -> ModelPublished:
    return ModelPublished(
        name=name, tenant=tenant, version=1, uri=f"file:///models/{name}/1", sha256="0" * 64, size_bytes=1,
        public=public,
    )  # fmt: skip


def alert_stream(alert_id: str, minute: int, *, resolved: bool, tenant: str | None = None) -> OldStream:
    data = AlertRaised(alert_id=alert_id, kind=AlertKind.GPU_IDLE, message="idle", tenant=tenant)
    raised = event(data, minute, f"raised-{minute}")
    view = AlertView(raised=data, raised_id=raised.id, raised_at=raised.time)
    events = [raised]
    if resolved:
        events.append(event(AlertResolved(alert_id=alert_id, kind=AlertKind.GPU_IDLE), minute + 1))
        view = view.model_copy(update={"resolved_id": events[-1].id, "resolved_at": events[-1].time})
    state = "alert-resolved" if resolved else "alert-active"
    doc = view.model_dump(mode="json")
    return OldStream(view.stream, events, state, tenant or "", doc, view.raised_at.isoformat())


def node_stream(node: str, datas: list[EventData], minute: int) -> OldStream:
    control, events = nodecontrol.NodeControl(node=node), []
    for i, data in enumerate(datas):
        events.append(event(data, minute + i))
        control = nodecontrol.apply(control, events[-1])
    doc = control.model_dump(mode="json")
    return OldStream(f"/nodes/{node}", events, "node-control", "", doc, events[0].time.isoformat())


def idle(cls: type[IdleWarning] | type[IdleStop], minute: int, **more: Any) -> CloudEvent:
    data = cls(
        job_id=QUEUED, attempt=1, tenant="vision", threshold_pct=5, window_seconds=600,
        max_utilization_pct=1, message="idle", **more,
    )  # fmt: skip
    return event(data, minute, f"idle-{minute}")


IDLE_WARNING = idle(IdleWarning, 40, grace_seconds=60, stop_at=at(41))
SPEC = JobSpec(command="true")


def old_streams() -> list[OldStream]:
    drain = NodeControlChanged(node="node-a", action=NodeAction.DRAIN, by="admin")
    cordon = NodeControlChanged(node="node-b", action=NodeAction.CORDON, by="admin")
    sick = GpuHealthChanged(node="node-c", index=0, reason="xid", message="fatal XID 79")
    return [
        job_stream(
            [event(JobSubmitted(job_id=QUEUED, name="train", tenant="vision", user="ana", spec=SPEC), 1)]
        ),
        job_stream(
            [
                event(JobSubmitted(job_id=ENDED, name="eval", tenant="nlp", user="bo", spec=SPEC), 2),
                event(JobCancelled(job_id=ENDED, attempt=1, by="bo"), 3),
            ]
        ),
        model_stream("vision", "mnist", [published("vision", "mnist", public=True)], 10),
        model_stream("nlp", "bert", [published("nlp", "bert")], 12),
        model_stream(
            "vision",
            "gone",
            [published("vision", "gone"), ModelDeleted(name="gone", tenant="vision", versions=[1])],
            14,
        ),
        alert_stream(ACTIVE_ALERT, 20, resolved=False, tenant="vision"),
        alert_stream(RESOLVED_ALERT, 22, resolved=True),
        node_stream("node-a", [drain], 30),
        node_stream("node-b", [cordon], 31),
        node_stream("node-c", [sick], 32),
        OldStream(idlebook.stream_id(QUEUED), [IDLE_WARNING]),
    ]


# ------------------------------------------------------------------ the old stores, raw


def write_old_sqlite(path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SQLITE_SCHEMA)
    for s in old_streams():
        conn.executemany(
            "INSERT INTO events (stream_id, version, event_id, type, data, recorded_at, published)"
            " VALUES (?,?,?,?,?,?,1)",
            [
                (s.stream_id, v, e.id, e.type, e.model_dump_json(serialize_as_any=True), time.time())
                for v, e in enumerate(s.events, 1)
            ],
        )
        if s.state is not None:
            assert s.doc is not None
            conn.execute(
                "INSERT INTO projections (stream_id, tenant, state, created_at, version, doc, ended_at, user, name)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    s.stream_id, s.tenant, s.state, s.created_at, len(s.events), json.dumps(s.doc), s.ended_at,
                    s.doc.get("user"), s.doc.get("name"),
                ),
            )  # fmt: skip
    conn.execute("INSERT INTO documents (key, doc) VALUES (?, ?)", (LINE_KEY, json.dumps(line_doc([QUEUED]))))
    conn.commit()
    conn.close()


async def write_old_mongo(url: str) -> None:
    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        db = client.get_default_database()
        await db["projections"].create_indexes(OLD_MONGO_INDEXES)
        for s in old_streams():
            await db["events"].insert_many(
                [
                    {
                        "_id": e.id,
                        "stream_id": s.stream_id,
                        "version": v,
                        "type": e.type,
                        "event": e.to_dict(),
                        "recorded_at": time.time(),
                        "published": True,
                    }  # fmt: skip
                    for v, e in enumerate(s.events, 1)
                ]
            )
            if s.state is not None:
                await db["projections"].insert_one(
                    {
                        "_id": s.stream_id,
                        "tenant": s.tenant,
                        "state": s.state,
                        "version": len(s.events),
                        "doc": s.doc,
                        "ended_at": s.ended_at,
                        "created_at": s.created_at,
                    }  # fmt: skip
                )
        await db["documents"].insert_one({"_id": LINE_KEY, "doc": line_doc([QUEUED])})
    finally:
        await client.close()


# ------------------------------------------------------------------ what reads it after


async def jobs_read_right(store: EventStore) -> None:
    assert [d["job_id"] for d in (await store.list_projections()).items] == [ENDED, QUEUED]
    assert await store.count_projections() == 2
    assert await store.count_projections(search="mnist") == await store.count_projections(search="node") == 0
    assert await store.versions(states=EVERY_JOB_STATE) == {QUEUED: 1, ENDED: 2}
    assert await store.count_by_tenant(states=EVERY_JOB_STATE) == {"vision": 1, "nlp": 1}
    assert list(await store.oldest_by_tenant(states=["queued"])) == ["vision"]
    assert [e.stream_id for e in await store.ended_since("")] == [ENDED]
    assert await store.expired(ended_before="9999") == [ENDED]
    assert await store.ids_starting("") == [QUEUED, ENDED]
    assert await store.ids_starting("m") == await store.ids_starting("/") == []
    assert await store.get_projection("model:vision:mnist") is None
    view = await JobLedger(store, None, "/test").load(QUEUED)
    assert view is not None and view.state == JobState.QUEUED
    assert await LineReader(store).place(QUEUED) == 1


async def read_models_read_right(store: EventStore) -> None:
    registry = ModelRegistry(store, None, "/test", None)  # type: ignore[arg-type]  # (no file is read)
    assert sorted(v.name for v in await registry.listed(tenant=None)) == ["bert", "mnist"]
    assert [v.name for v in await registry.listed(tenant=None, public=True)] == ["mnist"]
    assert [v.name for v in await registry.listed(tenant="nlp")] == ["bert"]
    gone = await registry.get("vision", "gone")
    assert gone is not None and gone.versions == [] and gone.removed == [1]
    book = AlertBook(store)
    assert [v.alert_id for v in await book.load()] == [ACTIVE_ALERT]
    resolved, _ = await list_alerts(store, states=[alertbook.RESOLVED], tenant=None)
    assert [v.alert_id for v in resolved] == [RESOLVED_ALERT]
    mine, _ = await list_alerts(store, states=[alertbook.ACTIVE, alertbook.RESOLVED], tenant="vision")
    assert [v.alert_id for v in mine] == [ACTIVE_ALERT]
    controls = await nodecontrol.load_all(store)
    assert {node: c.state for node, c in controls.items()} == {
        "node-a": "draining",
        "node-b": "cordoned",
        "node-c": "ready",
    }
    for control in controls.values():  # (the state each was given is the one this release writes)
        found = await store.list_projections(kind=StreamKind.NODE, states=[control.state])
        assert [d["node"] for d in found.items] == [control.node]
    assert controls["node-c"].unhealthy == {0: "fatal XID 79"}
    assert await idlebook.holds(store, IDLE_WARNING)


async def streams_go_on_under_their_kinds(store: EventStore) -> None:
    """Each stream is appended to under its own kind (a kind left wrong would refuse it: StreamKindError)."""
    book = AlertBook(store)
    await book.load()
    resolve = event(AlertResolved(alert_id=ACTIVE_ALERT, kind=AlertKind.GPU_IDLE), 50)
    assert await book.record(resolve) is True
    assert [v.alert_id for v in await alertbook.active_alerts(store)] == []
    uncordon = event(NodeControlChanged(node="node-a", action=NodeAction.UNCORDON, by="admin"), 51)
    assert (await nodecontrol.record(store, uncordon)).state == "ready"
    assert await idlebook.record(store, idle(IdleStop, 52, idle_seconds=60)) is True
    registry = ModelRegistry(store, None, "/test", None)  # type: ignore[arg-type]
    assert (await registry.set_public("nlp", "bert", True, by="bo")).public
    assert [v.name for v in await registry.listed(tenant=None, public=True)] == ["bert", "mnist"]
    assert await store.count_projections() == 2


# ------------------------------------------------------------------ the embedded store


async def test_an_embedded_store_of_the_release_before_kinds_is_migrated_once(tmp_path):
    path = tmp_path / "events.db"
    write_old_sqlite(path)
    store = await SqliteEventStore.open(path)
    try:
        await jobs_read_right(store)
        await read_models_read_right(store)
        kinds = dict(store.read_conn.execute("SELECT stream_id, kind FROM events WHERE version = 1"))
        assert kinds == {s.stream_id: kind_of(s.stream_id) for s in old_streams()}
        await streams_go_on_under_their_kinds(store)
    finally:
        await store.close()
    witness = sqlite3.connect(path)  # a row as the release before wrote it: a second open leaves it so
    witness.execute(
        "INSERT INTO projections (stream_id, tenant, state, created_at, version, doc)"
        " VALUES ('/alerts/witness', '', 'alert-active', '2026-01-01', 1, '{}')"
    )
    witness.commit()
    witness.close()
    again = await SqliteEventStore.open(path)
    try:
        row = again.read_conn.execute(
            "SELECT kind, state FROM projections WHERE stream_id = '/alerts/witness'"
        )
        assert row.fetchone() == ("job", "alert-active")
        indexes = dict(again.read_conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
        assert (
            "(kind, state, created_at, stream_id, tenant, user, name)" in indexes["projections_state_listing"]
        )
    finally:
        await again.close()


async def test_two_services_opening_an_old_embedded_store_at_once_both_find_it_migrated(tmp_path):
    path = tmp_path / "events.db"
    write_old_sqlite(path)
    stores = await asyncio.gather(SqliteEventStore.open(path), SqliteEventStore.open(path))
    try:
        for store in stores:
            await jobs_read_right(store)
    finally:
        for store in stores:
            await store.close()


def kind_of(stream_id: str) -> StreamKind:
    """The kind the release before meant by a stream's id."""
    prefixes = {"model:": "model", "/alerts/": "alert", "/nodes/": "node", "/idle/": "idle"}
    return StreamKind(next((k for p, k in prefixes.items() if stream_id.startswith(p)), "job"))


# ------------------------------------------------------------------ MongoDB


@pytest.fixture(params=[backend for backend in EVENT_STORE_BACKENDS if backend != SQLITE])
async def mongo_url(request) -> str:
    async with fresh_database(request, request.param) as url:
        yield url


async def test_a_mongodb_store_of_the_release_before_kinds_is_migrated_once(mongo_url):
    await write_old_mongo(mongo_url)
    async with await open_store(mongo_url) as store:
        await jobs_read_right(store)
        await read_models_read_right(store)
        events = store.db["events"]  # type: ignore[attr-defined]
        kinds = {d["stream_id"]: d["kind"] async for d in events.find({"version": 1})}
        assert kinds == {s.stream_id: kind_of(s.stream_id) for s in old_streams()}
        await streams_go_on_under_their_kinds(store)
        db = store.db  # type: ignore[attr-defined]
        indexes = {index["name"] async for index in await db["projections"].list_indexes()}
        assert indexes >= {index.document["name"] for index in PROJECTION_INDEXES}
        assert not indexes & set(FORMER_INDEXES)
        assert (await db["schema"].find_one({"_id": "event-store"}))["version"] == SCHEMA_VERSION
        await db["projections"].insert_one(  # a document as the release before wrote it: left so
            {"_id": "/alerts/witness", "tenant": "", "state": "alert-active", "version": 1, "doc": {}}
        )
    async with await open_store(mongo_url) as again:
        found = await again.db["projections"].find_one({"_id": "/alerts/witness"})  # type: ignore[attr-defined]
        assert "kind" not in found and found["state"] == "alert-active"
