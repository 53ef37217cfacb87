"""The job ledger: the only way a service changes a job.

It loads the job's events, lets the caller decide on the current view, checks the decision against the
state machine, appends it with the expected version (retrying on a concurrent write), and publishes it.
Publishing is guarded by an outbox: an event stored but not yet published (a crash in between) is published
by the relay later; JetStream drops a duplicate by its Nats-Msg-Id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from shared.bus import Bus
from shared.events import CloudEvent, EventData, make_event
from shared.jobstate import IllegalTransition, JobView, apply, fold
from shared.store import ConcurrencyError, EventStore, Projection

log = logging.getLogger(__name__)

Decide = Callable[[JobView | None], EventData | None]
MAX_CONFLICT_RETRIES = 8


@dataclass(slots=True)
class Outcome:
    view: JobView | None  # the job after the call (unchanged if nothing was applied)
    event: CloudEvent | None = None
    applied: bool = False
    duplicate: bool = False
    refused: IllegalTransition | None = None


def projection_of(view: JobView) -> Projection:
    return Projection(
        stream_id=view.job_id,
        tenant=view.tenant,
        state=view.state.value,
        created_at=view.created_at.isoformat(),
        version=view.version,
        doc=view.model_dump(mode="json"),
    )


class JobLedger:
    def __init__(self, store: EventStore, bus: Bus | None, source: str):
        self.store = store
        self.bus = bus
        self.source = source
        self._published: list[str] = []
        self._relay: asyncio.Task | None = None

    async def load(self, job_id: str) -> JobView | None:
        return fold([s.event for s in await self.store.read_stream(job_id)])

    async def events(self, job_id: str) -> list[CloudEvent]:
        return [s.event for s in await self.store.read_stream(job_id)]

    async def record(
        self, job_id: str, decide: Decide, *, event_id: Callable[[JobView | None], str] | None = None
    ):
        """Apply what `decide(current view)` returns (None: nothing to do). Idempotent when `event_id` is
        deterministic: the same fact recorded twice is stored once."""
        for _ in range(MAX_CONFLICT_RETRIES):
            history = await self.events(job_id)
            view = fold(history)
            data = decide(view)
            if data is None:
                return Outcome(view)
            event = make_event(data, source=self.source, id=event_id(view) if event_id else None)
            if any(e.id == event.id for e in history):
                return Outcome(view, event, duplicate=True)  # this fact is already recorded
            try:
                new = apply(view, event)
            except IllegalTransition as exc:
                log.warning(
                    "refused %s for job %s: %s; event: %s", event.type, job_id, exc, event.to_json().decode()
                )
                return Outcome(view, event, refused=exc)
            try:
                result = await self.store.append(
                    job_id, view.version if view else 0, [event], projection_of(new)
                )
            except ConcurrencyError:
                continue  # someone wrote first: decide again on the newer view
            if result.duplicate:
                return Outcome(view, event, duplicate=True)
            await self._publish(event)
            return Outcome(new, event, applied=True)
        raise ConcurrencyError(job_id, -1, -1)

    async def append(self, job_id: str, data: EventData, *, event_id: str | None = None) -> Outcome:
        """Record one given event (no decision to make)."""
        return await self.record(
            job_id, lambda _view: data, event_id=(lambda _view: event_id) if event_id else None
        )

    async def _publish(self, event: CloudEvent) -> None:
        if self.bus is None:
            return
        try:
            await self.bus.publish(event)
        except Exception as exc:  # the relay will publish it
            log.warning("publish of %s %s failed, left to the outbox relay: %s", event.type, event.id, exc)
            return
        self._published.append(event.id)

    # ------------------------------------------------------------------ outbox relay

    def start_relay(self, *, interval: float = 0.5, grace: float = 3.0) -> None:
        self._relay = asyncio.create_task(self._relay_loop(interval, grace), name="outbox-relay")

    async def _relay_loop(self, interval: float, grace: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush(grace=grace)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("outbox relay: %s", exc)

    async def flush(self, *, grace: float = 3.0) -> int:
        """Mark what was published, then publish what was stored but never published."""
        done, self._published = self._published, []
        await self.store.mark_published(done)
        if self.bus is None:
            return 0
        pending = await self.store.unpublished(older_than=grace)
        for event in pending:
            await self.bus.publish(event)
        await self.store.mark_published([e.id for e in pending])
        return len(pending)

    async def close(self) -> None:
        if self._relay is not None:
            self._relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relay
        with contextlib.suppress(Exception):
            await self.store.mark_published(self._published)
