"""The event store's first capability: recording events. Append-only streams with optimistic concurrency (a
stream's version is the number of its events), each append atomic with its stream's projection, and an outbox
flag so that an event stored but not yet published is published later."""

from __future__ import annotations

from abc import ABC, abstractmethod

from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.stores.events.base import (
    Append,
    AppendResult,
    ConcurrencyError,
    Projection,
    StoredEvent,
    StreamKind,
)


class EventRecorder(ABC):
    """Appends events to streams and reads them back; the outbox of what is not published yet."""

    @abstractmethod
    async def append(
        self,
        stream_id: str,
        expected_version: int,
        events: list[CloudEvent],
        projection: Projection | None = None,
        *,
        kind: StreamKind = StreamKind.JOB,
    ) -> AppendResult:
        """Append `events` if the stream is at `expected_version` (0 for a new stream), atomically with the
        projection; a new stream is of `kind`, which the events and the projection are stored with. If every
        event id is already stored, nothing changes and `duplicate` is True. Raises ConcurrencyError when
        another writer got there first, StreamKindError (nothing written) when the stream is of another kind."""

    async def append_many(self, appends: list[Append]) -> list[AppendResult | ConcurrencyError]:
        """Several streams' appends, each checked on its own: a conflict on one is returned in its place and
        the others still go in. Adapters that can make it one transaction do; this default appends in turn.
        An append to a stream of another kind raises StreamKindError (a bug: the others may have gone in)."""
        results: list[AppendResult | ConcurrencyError] = []
        for a in appends:
            try:
                results.append(
                    await self.append(a.stream_id, a.expected_version, a.events, a.projection, kind=a.kind)
                )
            except ConcurrencyError as exc:
                results.append(exc)
        return results

    @abstractmethod
    async def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        """The events of one stream with a version above `after_version` (all of them by default), oldest
        first. A reader that holds the state up to some version catches up with this alone."""

    @abstractmethod
    async def unpublished(self, *, older_than: float, limit: int = 500) -> list[CloudEvent]:
        """Events stored at least `older_than` seconds ago and not yet marked published (the outbox), of
        every kind."""

    @abstractmethod
    async def mark_published(self, event_ids: list[str]) -> None: ...
