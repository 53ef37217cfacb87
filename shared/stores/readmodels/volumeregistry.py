"""Volumes in the event store: one stream per volume (`volume:<tenant>:<name>`), holding its creation, its
uploads and deletions of files, and its deletion, with a projection (`VolumeView`) for listing; and the registry
that records them.

A volume's stream is of the kind `StreamKind.VOLUME`; its projection's state is `ready` or `deleted`. A deleted
volume's name may be used again: its stream goes on with a new `volume.created`.

The registry records what a volume is (its owner, its size); its bytes are in the storage root
(`gpuyard.shared.runtime.paths.volume_dir`), written by the API (`services/submit/volumefiles.py`) and by the
jobs that mount it. Sizes are reserved: a tenant's volumes may together be as large as its volume quota
(`GPUYARD_VOLUME_QUOTA`), as Kubernetes counts the storage its claims request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.volumes import (
    VolumeCreated,
    VolumeDeleted,
    VolumeFilesDeleted,
    VolumeFilesWritten,
)
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobView, state_values
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.stores.events import EventStore, Projection, Projections, StreamKind
from gpuyard.shared.stores.readmodels.recording import record_in_stream

STREAM_PREFIX = "volume:"
"""Volume streams' ids begin with it: never a job's (nor any other kind's) stream id."""
KIND = StreamKind.VOLUME
READY = "ready"
DELETED = "deleted"
PAGE = 500


def stream_id(tenant: str, name: str) -> str:
    return f"{STREAM_PREFIX}{tenant}:{name}"


class VolumeView(BaseModel):
    """A volume as its events made it: the projection of its stream."""

    model_config = ConfigDict(frozen=True)
    name: str
    tenant: str
    size_bytes: int
    deleted: bool = False
    created_at: datetime
    created_by: str = ""
    updated_at: datetime
    version: int = 0
    """The stream's version (events applied)."""

    @property
    def state(self) -> str:
        return DELETED if self.deleted else READY


class VolumeError(Exception):
    """A request the registry refuses; `status` is the HTTP answer it stands for (404, 409, 422)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def apply(view: VolumeView | None, event: CloudEvent, version: int) -> VolumeView:
    """`view` with `event` (the stream's `version`-th) applied."""
    data, at = event.data, event.time
    update: dict = {"version": version, "updated_at": at}
    if isinstance(data, VolumeCreated):
        return VolumeView(
            name=data.name, tenant=data.tenant, size_bytes=data.size_bytes, created_at=at, created_by=data.by,
            updated_at=at, version=version,
        )  # fmt: skip
    if view is None:
        raise ValueError(f"a volume's stream begins with volume.created, not {event.type}")
    if isinstance(data, VolumeDeleted):
        update["deleted"] = True
    elif not isinstance(data, VolumeFilesWritten | VolumeFilesDeleted):
        raise ValueError(f"{event.type} is not a volume event")
    return view.model_copy(update=update)


def projection_of(view: VolumeView) -> Projection:
    return Projection(
        stream_id=stream_id(view.tenant, view.name),
        tenant=view.tenant,
        state=view.state,
        created_at=view.created_at.isoformat(),
        version=view.version,
        doc=view,
    )


async def live_mounting_jobs(store: Projections, tenant: str, name: str) -> list[JobView]:
    """The jobs not yet ended (`LIVE_STATES`) of `tenant` that mount its volume `name`, newest first. (Found among
    the tenant's live jobs: a store index on mounts would spare the scan, once those are many.)"""
    found: list[JobView] = []
    cursor = None
    while True:
        page = await store.list_projections(
            states=state_values(LIVE_STATES), tenant=tenant, limit=PAGE, cursor=cursor
        )
        for doc in page.items:
            if any(v.get("name") == name for v in (doc.get("spec") or {}).get("volumes") or ()):
                found.append(JobView.model_validate(doc))
        if not page.next_cursor:
            return found
        cursor = page.next_cursor


Decide = Callable[[VolumeView | None], Awaitable[EventData | None]]


class VolumeRegistry:
    """Makes, lists and deletes volumes and records their uploads: their events in the event store."""

    def __init__(self, store: EventStore, bus: Bus | None, source: str):
        self.store = store
        self.bus = bus
        self.source = source
        self._creating: dict[str, asyncio.Lock] = {}

    async def get(self, tenant: str, name: str) -> VolumeView | None:
        """The volume, None when there is none (or it was deleted)."""
        doc = await self.store.get_projection(stream_id(tenant, name), kind=KIND)
        view = VolumeView.model_validate(doc) if doc is not None else None
        return view if view is not None and not view.deleted else None

    async def listed(self, tenant: str | None) -> list[VolumeView]:
        """The volumes of `tenant` (every tenant's: None), oldest first."""
        found, cursor = [], None
        while True:
            page = await self.store.list_projections(
                states=[READY], tenant=tenant, limit=PAGE, cursor=cursor, kind=KIND, order="oldest"
            )
            found += [VolumeView.model_validate(d) for d in page.items]
            if not page.next_cursor:
                return found
            cursor = page.next_cursor

    async def record(
        self, tenant: str, name: str, decide: Decide
    ) -> tuple[VolumeView | None, CloudEvent | None]:
        """Store and publish what `decide(current view)` returns (None: nothing); decided again on a newer view
        when another writer got there first."""
        return await record_in_stream(
            self.store,
            self.bus,
            self.source,
            stream_id(tenant, name),
            KIND,
            read=lambda: self._read(tenant, name),
            apply=apply,
            projection_of=projection_of,
            decide=decide,
        )

    async def _read(self, tenant: str, name: str) -> VolumeView | None:
        doc = await self.store.get_projection(stream_id(tenant, name), kind=KIND)
        return VolumeView.model_validate(doc) if doc is not None else None

    async def create(self, tenant: str, name: str, size_bytes: int, quota_bytes: int, by: str) -> VolumeView:
        """A new, empty volume. VolumeError 409 for a name in use, 422 past the tenant's quota (0: none)."""
        lock = self._creating.setdefault(tenant, asyncio.Lock())
        async with lock:  # two creates of one tenant do not both take the last of its quota
            reserved = sum(v.size_bytes for v in await self.listed(tenant))
            if quota_bytes and reserved + size_bytes > quota_bytes:
                raise VolumeError(
                    422,
                    f"a volume of {format_size(size_bytes)} would take tenant {tenant!r} past its volume quota "
                    f"of {format_size(quota_bytes)} ({format_size(reserved)} in use by its volumes): "
                    "delete one, or ask for a smaller size",
                )

            async def decide(view: VolumeView | None) -> EventData | None:
                if view is not None and not view.deleted:
                    raise VolumeError(409, f"volume {name!r} exists")
                return VolumeCreated(name=name, tenant=tenant, size_bytes=size_bytes, by=by)

            view, _ = await self.record(tenant, name, decide)
        assert view is not None
        return view

    async def written(self, tenant: str, name: str, path: str, files: int, size: int, by: str) -> None:
        """Record an upload's files, once they are in place."""

        async def decide(view: VolumeView | None) -> EventData | None:
            if view is None or view.deleted:
                raise VolumeError(404, f"no volume {name!r}")
            return VolumeFilesWritten(name=name, tenant=tenant, path=path, files=files, bytes=size, by=by)

        await self.record(tenant, name, decide)

    async def files_deleted(self, tenant: str, name: str, path: str, files: int, size: int, by: str) -> None:
        async def decide(view: VolumeView | None) -> EventData | None:
            if view is None or view.deleted:
                raise VolumeError(404, f"no volume {name!r}")
            return VolumeFilesDeleted(name=name, tenant=tenant, path=path, files=files, bytes=size, by=by)

        await self.record(tenant, name, decide)

    async def delete(self, tenant: str, name: str, size: int, by: str) -> None:
        """Mark the volume deleted (its files are removed by the caller, after). VolumeError 404 for none, 409
        while a live job mounts it."""

        async def decide(view: VolumeView | None) -> EventData | None:
            if view is None or view.deleted:
                raise VolumeError(404, f"no volume {name!r}")
            jobs = await live_mounting_jobs(self.store, tenant, name)
            if jobs:
                ids = ", ".join(j.job_id for j in jobs[:5])
                more = f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""
                which = "it" if len(jobs) == 1 else "them"
                raise VolumeError(
                    409,
                    f"volume {name!r} is mounted by live job{'s' if len(jobs) > 1 else ''} {ids}{more}: "
                    f"cancel {which} or wait for {which} to end",
                )
            return VolumeDeleted(name=name, tenant=tenant, bytes=size, by=by)

        await self.record(tenant, name, decide)
