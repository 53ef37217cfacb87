"""The idle-GPU reclaim's record in the event store: one stream per job (`/idle/<job id>`, of the kind
`StreamKind.IDLE`) holding its `idle.warning` and `idle.stop` events, in order, without a projection (nothing
lists them: a stopped job's reason and figures are in its own `job.failed`).

The monitor records each of them here before it publishes it (what is not published is its outbox relay's),
and the executor acts on one only when this stream holds it: the bus says what to read, the store is the truth,
as for job events. Writes are idempotent: the event ids are derived from the facts, and the store refuses a
known id.
"""

from __future__ import annotations

from gpuyard.shared.contracts.events.alerts import IdleStop, IdleWarning
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.stores.events import ConcurrencyError, EventRecorder, StreamKind

STREAM_PREFIX = "/idle/"
"""Idle streams' ids begin with it: never a job's (nor any other kind's) stream id."""
KIND = StreamKind.IDLE
WRITES = 5


def stream_id(job_id: str) -> str:
    return f"{STREAM_PREFIX}{job_id}"


async def record(store: EventRecorder, event: CloudEvent) -> bool:
    """Store an `idle.warning` or `idle.stop` at the end of its job's stream; True when it is new."""
    if not isinstance(event.data, IdleWarning | IdleStop):
        raise ValueError(f"{event.type} is not an idle-reclaim event")
    stream = stream_id(event.data.job_id)
    for _ in range(WRITES):
        version = len(await store.read_stream(stream))
        try:
            result = await store.append(stream, version, [event], kind=KIND)
        except ConcurrencyError:  # another writer in between (a monitor that led a moment ago): read again
            continue
        return not result.duplicate
    raise ConcurrencyError(stream, -1, -1)


async def holds(store: EventRecorder, event: CloudEvent) -> bool:
    """Whether the store holds `event` in its job's idle stream (one that it does not was never recorded)."""
    job_id = getattr(event.data, "job_id", None)
    if not job_id or job_id != event.subject:
        return False
    return any(stored.event.id == event.id for stored in await store.read_stream(stream_id(job_id)))
