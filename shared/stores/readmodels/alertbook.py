"""Alerts in the event store: one stream per occurrence of an alert (`/alerts/<alert id>@<its raise event id>`),
holding its `alert.raised` and, once it clears, its `alert.resolved`, with a projection (`AlertView`) for
listing: the monitor writes them, the API lists them (`GET /v1/alerts`), after any restart.

An alert's stream is of the kind `StreamKind.ALERT`, which the readers of jobs never read, and its projection is
its tenant's (the tenant of the job it is about; `PLATFORM`, the empty tenant, for one about a node or a GPU:
admins only), in the state `active` or `resolved` (`AlertState`). Its stream id begins with `/alerts/`, so that
it is never a job's id.

Writes are idempotent: a stream's first event is its raise, at version 1, and its resolve at version 2; the same
event again changes nothing (the store refuses a known event id), so a redelivered or re-published alert is
recorded once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from gpuyard.shared.contracts.api.alerts import AlertOut, AlertState
from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.stores.events import (
    ConcurrencyError,
    EventStore,
    Page,
    Projection,
    Projections,
    StreamKind,
)
from gpuyard.shared.stores.events.base import encode_cursor

log = logging.getLogger(__name__)

STREAM_PREFIX = "/alerts/"
"""Alert streams' ids begin with it: never a job's (nor any other kind's) stream id."""
KIND = StreamKind.ALERT
ACTIVE = AlertState.ACTIVE.value
RESOLVED = AlertState.RESOLVED.value
PLATFORM = ""
"""The tenant of an alert about no job: only admins see it."""
PAGE = 500
RECORDED_REMEMBERED = 10_000


def stream_id(alert_id: str, raised_id: str) -> str:
    return f"{STREAM_PREFIX}{alert_id}@{raised_id}"


class AlertView(BaseModel):
    """One occurrence of an alert: its raise, and its resolve once it cleared."""

    model_config = ConfigDict(frozen=True)
    raised: AlertRaised
    raised_id: str
    raised_at: datetime
    resolved_id: str | None = None
    resolved_at: datetime | None = None
    resolved_message: str = ""

    @property
    def alert_id(self) -> str:
        return self.raised.alert_id

    @property
    def state(self) -> str:
        return RESOLVED if self.resolved_at else ACTIVE

    @property
    def stream(self) -> str:
        return stream_id(self.raised.alert_id, self.raised_id)


def projection_of(view: AlertView, version: int) -> Projection:
    return Projection(
        stream_id=view.stream,
        tenant=view.raised.tenant or PLATFORM,
        state=view.state,
        created_at=view.raised_at.isoformat(),
        version=version,
        doc=view,
    )


class AlertBook:
    """Records alert events in the store, once each, and keeps the active ones by alert id (one process's
    index: `load` fills it from the store at start)."""

    def __init__(self, store: EventStore):
        self.store = store
        self.active: dict[str, AlertView] = {}
        self.recorded: OrderedDict[str, None] = OrderedDict()
        """The ids of the events this book stored or found stored lately (a bounded memory): recorded again
        (the monitor's own alerts come back on the bus), they cost no read."""

    async def load(self) -> list[AlertView]:
        """The active alerts, from the store."""
        views = await active_alerts(self.store)
        self.active = {v.alert_id: v for v in sorted(views, key=lambda v: v.raised_at)}
        return list(self.active.values())

    async def record(self, event: CloudEvent, *, raised_id: str | None = None) -> bool:
        """Store an `alert.raised` or `alert.resolved` event; True when it is new (a first record). A resolve
        ends the occurrence `raised_id` names, or the active one of its alert id."""
        if event.id in self.recorded:
            return False
        new = await self._record(event, raised_id)
        self.recorded[event.id] = None
        if len(self.recorded) > RECORDED_REMEMBERED:
            self.recorded.popitem(last=False)
        return new

    async def _record(self, event: CloudEvent, raised_id: str | None) -> bool:
        data = event.data
        if isinstance(data, AlertRaised):
            raised = AlertView(raised=data, raised_id=event.id, raised_at=event.time)
            result = await self._append(raised.stream, 0, event, projection_of(raised, 1))
            if result:
                self.active[data.alert_id] = raised
            return result
        if not isinstance(data, AlertResolved):
            raise ValueError(f"{event.type} is not an alert event")
        view = self.active.get(data.alert_id)
        if raised_id is not None and (view is None or view.raised_id != raised_id):
            doc = await self.store.get_projection(stream_id(data.alert_id, raised_id), kind=KIND)
            view = AlertView.model_validate(doc) if doc else None
        if view is None:
            view = await self._find_active(data.alert_id)
        if view is None or view.resolved_at is not None:
            log.info("alert %s resolved (%s): no active raise of it recorded", data.alert_id, event.id)
            return False
        done = view.model_copy(
            update={"resolved_id": event.id, "resolved_at": event.time, "resolved_message": data.message}
        )
        result = await self._append(done.stream, 1, event, projection_of(done, 2))
        if self.active.get(data.alert_id) is view or result:
            self.active.pop(data.alert_id, None)
        return result

    async def _append(self, stream: str, expected: int, event: CloudEvent, projection: Projection) -> bool:
        try:
            result = await self.store.append(stream, expected, [event], projection, kind=KIND)
        except ConcurrencyError:  # resolved already, by another event
            return False
        return not result.duplicate

    async def _find_active(self, alert_id: str) -> AlertView | None:
        found = [v for v in await active_alerts(self.store) if v.alert_id == alert_id]
        return max(found, key=lambda v: v.raised_at) if found else None


async def active_alerts(store: Projections) -> list[AlertView]:
    views, cursor = [], None
    while True:
        page = await store.list_projections(states=[ACTIVE], limit=PAGE, cursor=cursor, kind=KIND)
        views += [AlertView.model_validate(d) for d in page.items]
        if not page.next_cursor:
            return views
        cursor = page.next_cursor


async def list_alerts(
    store: Projections,
    *,
    states: list[str],
    tenant: str | None,
    kind: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[AlertView], str | None]:
    """Alerts newest first (by when they were raised), of `tenant` (every tenant's: None), in `states`, of one
    `kind` if given; at most `limit`, and the cursor of the next page. ValueError for a bad cursor."""
    found: list[AlertView] = []
    while len(found) < limit:
        page: Page = await store.list_projections(
            states=states, tenant=tenant, limit=limit if kind is None else PAGE, cursor=cursor, kind=KIND
        )
        for doc in page.items:
            view = AlertView.model_validate(doc)
            if kind is None or view.raised.kind == kind:
                found.append(view)
        cursor = page.next_cursor
        if not cursor:
            break
    if len(found) > limit:  # (with a kind: the rest of that page is read again from the cursor of the last)
        found = found[:limit]
        last = found[-1]
        cursor = encode_cursor(last.raised_at.isoformat(), last.stream)
    return found, cursor


def alert_out(view: AlertView) -> AlertOut:
    """The public form of an alert's stored view."""
    raised = view.raised
    return AlertOut(
        alert_id=raised.alert_id,
        kind=raised.kind,
        severity=raised.severity,
        state=AlertState.RESOLVED if view.resolved_at else AlertState.ACTIVE,
        message=raised.message,
        node=raised.node,
        gpu_index=raised.gpu_index,
        job_id=raised.job_id,
        tenant=raised.tenant,
        user=raised.user,
        value=raised.value,
        threshold=raised.threshold,
        raised_at=view.raised_at,
        resolved_at=view.resolved_at,
        resolved_message=view.resolved_message,
    )
