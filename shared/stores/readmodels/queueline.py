"""The queue's line: the ids of the waiting jobs that have a place in line, in order, as one document that the
scheduler stores every `LINE_SECONDS` while jobs wait and it changed (`DocumentStore.put_document`), and that
the API reads to say each queued job's place (`LineReader`).

A job's place moves with every job placed ahead of it. Kept in each job's view, it had to be rewritten for
the whole queue as the head moved: one `job.pending` event per job and turn, a cost in the depth of the
queue. The line costs one write per turn instead, and a job's `job.pending` is written when its reason
changes (its code or its sentence) or its estimated start does, never for its place alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuyard.shared.stores.events import DocumentStore

LINE_KEY = "queue-line"
LINE_SECONDS = 2.0
"""How often the scheduler stores the line while jobs wait (and once more when the queue empties)."""
LINE_MAX_JOBS = 100_000
"""The line holds the first jobs in line up to this many (about 2 MB: a MongoDB document holds 16); a job
further back is told the place its reason was given with."""
READ_SECONDS = 1.0
"""How often an API process reads the line again, at most (and only when asked for a place)."""


def line_doc(jobs: list[str], at: datetime | None = None) -> dict[str, Any]:
    return {"at": (at or datetime.now(UTC)).isoformat(), "jobs": jobs}


class LineReader:
    """The places in the line the scheduler stored last, read again at most every `READ_SECONDS`."""

    def __init__(self, store: DocumentStore, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.clock = clock
        self.read_at = -READ_SECONDS
        self.at: str | None = None  # the line's time
        self.places: dict[str, int] = {}

    async def place(self, job_id: str) -> int | None:
        """The job's place in line (1 = next), None when the line does not hold it."""
        await self.refresh()
        return self.places.get(job_id)

    async def refresh(self) -> None:
        if self.clock() - self.read_at < READ_SECONDS:
            return
        self.read_at = self.clock()
        doc = await self.store.get_document(LINE_KEY)
        at = doc.get("at") if doc else None
        if at != self.at:
            self.at = at
            self.places = {job_id: n for n, job_id in enumerate(doc["jobs"], 1)} if doc else {}
