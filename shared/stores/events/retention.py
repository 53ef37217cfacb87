"""The event store's retention of ended jobs (`services/submit/retention.py` sweeps with it): which jobs
ended long enough ago, and the compaction of their streams."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Retention(ABC):
    """Finds the jobs whose retention ran out and compacts their streams."""

    @abstractmethod
    async def expired(self, *, ended_before: str, limit: int = 500) -> list[str]:
        """Jobs whose projection ended (a final state) before `ended_before` (ISO 8601) and that are not
        compacted yet, oldest end first."""

    @abstractmethod
    async def compact(self, stream_id: str) -> int:
        """Collapse an ended job's stream to its first event (`job.submitted`: the spec, and the id an
        idempotent submit finds again) and its last one (the stream's version, so that a writer at an older
        version is still refused), the projection holding the state in full: the snapshot a reader folds from
        (`JobLedger`). Returns the events deleted; 0 (and nothing changes) when the stream is no job's, has not
        ended, is compacted already, or has events not yet published (the outbox still needs them)."""

    async def reclaim(self) -> None:
        """Give the space freed by `compact` back where the backend needs to be told (SQLite); else nothing."""
        return None
