"""Node controls in the event store: one stream per node (`/nodes/<node>`) holding its GPUs' health marks
(`node.gpu_health`, written by the node's monitor) and the admins' cordons, drains and uncordons
(`node.control`, written by the API), with a projection (`NodeControl`) that the scheduler reads at start and
again after each such event, and that `GET /v1/nodes` shows.

Why the event store and not the samples or heartbeats: a mark must outlive the process that made it. A
restarted scheduler reads every node's projection (`load_all`), and a fatal XID, seen once in one sample, is
not seen again in the next; the telemetry stream keeps samples and heartbeats for one hour only.

A node's stream is of the kind `StreamKind.NODE`, which the readers of jobs never read; its projection's tenant
is the platform's (empty: admins only), its state the node's own (`NodeControl.state`: `ready`, `cordoned` or
`draining`), and its stream id begins with `/nodes/`, so that it is never a job's id.

Writes are idempotent (the store refuses a known event id) and retried on a concurrent write to the stream.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.contracts.api.nodes import NodeState
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, NodeAction, NodeControlChanged
from gpuyard.shared.stores.events import ConcurrencyError, EventStore, Projection, Projections, StreamKind

log = logging.getLogger(__name__)

STREAM_PREFIX = "/nodes/"
"""Node streams' ids begin with it: never a job's (nor any other kind's) stream id."""
KIND = StreamKind.NODE
PLATFORM = ""
PAGE = 500
WRITE_RETRIES = 20


def stream_id(node: str) -> str:
    return f"{STREAM_PREFIX}{node}"


class GpuControl(BaseModel):
    model_config = ConfigDict(frozen=True)
    cordoned: bool = False
    draining: bool = False
    unhealthy: str | None = Field(None, description="Why the GPU is unhealthy (None: healthy).")
    unhealthy_since: datetime | None = None


class NodeControl(BaseModel):
    """What admins and the node's monitor said of a node, folded from its stream."""

    model_config = ConfigDict(frozen=True)
    node: str
    cordoned: bool = False
    draining: bool = False
    reason: str = ""
    by: str = ""
    gpus: dict[int, GpuControl] = Field(default_factory=dict)
    """Only the GPUs with something to say (cordoned, draining, unhealthy)."""
    updated_at: datetime | None = None

    def gpu(self, index: int) -> GpuControl:
        return self.gpus.get(index) or GpuControl()

    def usable(self, index: int) -> bool:
        """May new work be placed on this GPU (the node's own cordon aside)?"""
        g = self.gpus.get(index)
        return g is None or not (g.cordoned or g.unhealthy)

    @property
    def state(self) -> str:
        """Its projection's state: what admins said of the whole node (its GPUs' marks aside)."""
        if self.draining:
            return NodeState.DRAINING.value
        return NodeState.CORDONED.value if self.cordoned else NodeState.READY.value

    @property
    def unhealthy(self) -> dict[int, str]:
        return {i: g.unhealthy for i, g in self.gpus.items() if g.unhealthy}


def apply(control: NodeControl, event: CloudEvent) -> NodeControl:
    """`control` after one event of its stream (any other event changes nothing)."""
    data = event.data
    gpus = dict(control.gpus)
    if isinstance(data, GpuHealthChanged):
        g = control.gpu(data.index)
        if data.healthy:
            g = g.model_copy(update={"unhealthy": None, "unhealthy_since": None})
        else:
            why = data.message or data.reason
            g = g.model_copy(update={"unhealthy": why, "unhealthy_since": g.unhealthy_since or event.time})
        gpus[data.index] = g
        return _tidy(control.model_copy(update={"gpus": gpus, "updated_at": event.time}))
    if not isinstance(data, NodeControlChanged):
        return control
    cordon = data.action in (NodeAction.CORDON, NodeAction.DRAIN)
    drain = data.action == NodeAction.DRAIN
    update: dict = {"updated_at": event.time, "by": data.by, "reason": data.reason}
    if data.gpu is None:
        if cordon:
            update |= {"cordoned": True, "draining": drain or control.draining}
        else:  # uncordon the node: its GPUs too, and their unhealthy marks
            update |= {"cordoned": False, "draining": False}
            gpus = {}
    elif cordon:
        g = control.gpu(data.gpu)
        gpus[data.gpu] = g.model_copy(update={"cordoned": True, "draining": drain or g.draining})
    else:
        gpus[data.gpu] = GpuControl()
    update["gpus"] = gpus
    return _tidy(control.model_copy(update=update))


def _tidy(control: NodeControl) -> NodeControl:
    kept = {i: g for i, g in sorted(control.gpus.items()) if g != GpuControl()}
    return control.model_copy(update={"gpus": kept})


async def stored(store: Projections, node: str) -> NodeControl | None:
    """The node's controls; None when nothing was ever said of it."""
    doc = await store.get_projection(stream_id(node), kind=KIND)
    return NodeControl.model_validate(doc) if doc else None


async def read(store: Projections, node: str) -> NodeControl:
    control = await stored(store, node)
    return control if control is not None else NodeControl(node=node)


async def load_all(store: Projections) -> dict[str, NodeControl]:
    """Every node's controls (the nodes nothing was ever said of are absent)."""
    out: dict[str, NodeControl] = {}
    cursor = None
    while True:
        page = await store.list_projections(limit=PAGE, cursor=cursor, kind=KIND)
        for doc in page.items:
            control = NodeControl.model_validate(doc)
            out[control.node] = control
        if not page.next_cursor:
            return out
        cursor = page.next_cursor


async def record(store: EventStore, event: CloudEvent) -> NodeControl:
    """Append `event` to its node's stream with the projection it leads to, and return that projection. The
    same event again changes nothing; a concurrent write to the stream is read and the append tried again."""
    data = event.data
    if not isinstance(data, GpuHealthChanged | NodeControlChanged):
        raise ValueError(f"{event.type} is not a node control event")
    node = data.node
    for _ in range(WRITE_RETRIES):
        events = await store.read_stream(stream_id(node))
        control = NodeControl(node=node)
        for stored in events:
            if stored.event.id == event.id:
                return await read(store, node)
            control = apply(control, stored.event)
        control = apply(control, event)
        created = events[0].event.time if events else event.time
        projection = Projection(
            stream_id=stream_id(node),
            tenant=PLATFORM,
            state=control.state,
            created_at=created.isoformat(),
            version=len(events) + 1,
            doc=control,
        )
        try:
            await store.append(stream_id(node), len(events), [event], projection, kind=KIND)
            return control
        except ConcurrencyError:
            await asyncio.sleep(0.01)
    raise ConcurrencyError(stream_id(node), -1, -1)  # (too many concurrent writers: the caller says so)
