"""The whole event store: every capability of it (`recorder.py`, `projections.py`, `documents.py`,
`retention.py`) in one object, which each adapter (`sqlite.py`, `mongo.py`) is. Code that needs one capability
only is given the store as that capability."""

from __future__ import annotations

from abc import abstractmethod

from gpuyard.shared.stores.events.documents import DocumentStore
from gpuyard.shared.stores.events.projections import Projections
from gpuyard.shared.stores.events.recorder import EventRecorder
from gpuyard.shared.stores.events.retention import Retention


class EventStore(EventRecorder, Projections, DocumentStore, Retention):
    """What every service sees of the event store, whatever the backend."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
