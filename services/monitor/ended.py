"""The jobs that end, each told once, from the event store's feed of ends (`EventStore.ended_since`): whatever
state a job ended from, those the live jobs never held included (cancelled while they waited, or run whole
between two refreshes).

A job's end time is taken when its last event is made, and writers on several processes commit in their own
order: a poll looks again `LAG_SECONDS` before the latest end it saw, passing over the jobs it told already
(kept while their end is that recent). Work per poll follows the jobs that ended, never the jobs stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gpuyard.shared.stores.events import EndedJob, Projections

LAG_SECONDS = 5.0
PAGE = 1000
"""Jobs per read of the feed (more than end in one instant: a page is continued from its last end time)."""


class EndedFeed:
    def __init__(
        self, store: Projections, on_ended: Callable[[EndedJob], None], *, since: datetime | None = None
    ):
        """`on_ended(job)`: each job that ended at `since` (default: now) or later, once, in about the order
        of their ends."""
        self.store = store
        self.on_ended = on_ended
        self.floor = (since or datetime.now(UTC)).isoformat()
        self.latest = self.floor  # the latest end told
        self.told: OrderedDict[str, str] = OrderedDict()  # job id -> end, of the ends within LAG_SECONDS

    async def poll(self) -> int:
        """Tell every job that ended since the last poll; returns how many."""
        count = 0
        start = max(self.floor, shifted(self.latest, -LAG_SECONDS))
        while True:
            page = await self.store.ended_since(start, limit=PAGE)
            for job in page:
                if job.stream_id in self.told:
                    continue
                self.told[job.stream_id] = job.ended_at
                self.latest = max(self.latest, job.ended_at)
                self.on_ended(job)
                count += 1
            if len(page) < PAGE or page[-1].ended_at == start:
                break
            start = page[-1].ended_at
        keep_from = shifted(self.latest, -LAG_SECONDS)
        while self.told and next(iter(self.told.values())) < keep_from:
            self.told.popitem(last=False)
        return count


def shifted(iso: str, seconds: float) -> str:
    return (datetime.fromisoformat(iso) + timedelta(seconds=seconds)).isoformat()
