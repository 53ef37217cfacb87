"""The monitor's part of the GPU history (`gpuyard.shared.stores.gpuhistory.base`): it writes its own node's samples, and compacts.

Every monitor writes the samples of its own node only: each point has one writer (no lease to wait for, no
point written twice by two monitors), the writes grow with the node, not with the cluster, and a node's
history does not depend on the bus carrying its samples to another monitor. The samples come from the
monitor's `SampleIngest` (`subscribe`): they are buffered, written every `history_flush_interval` in one
write, and the history is compacted every `history_bucket`: this node's old samples, and another node's once
they are older still (`ORPHAN_AFTER`: a node gone for good leaves none behind); with MongoDB, several monitors
compacting the same samples never count one twice (`gpuyard.shared.stores.gpuhistory.mongo`). The buffer is bounded: if the
history cannot be written for long, the oldest samples are dropped, never the sampling held up; that it
cannot is said once (`Outage`), and once that it is written again. `keep_history` runs it, once the history
is open (`open_history` tries again while it cannot be opened).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from gpuyard.services.monitor.ingest import NodeSample, SampleIngest
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.stores.events import Outage
from gpuyard.shared.stores.gpuhistory.base import GpuHistory, GpuPoint, open_gpu_history

log = logging.getLogger(__name__)

MAX_BUFFERED_SAMPLES = 3600
"""Samples kept while the history cannot be written (an hour at 1 Hz); older ones are dropped."""
HISTORY_RETRY_MAX = 60.0
"""Most seconds between two tries to open the GPU history (the wait doubles from 1 s)."""


class HistoryWriter:
    def __init__(self, history: GpuHistory, settings: MonitorSettings, *, clock=time.time):
        self.history = history
        self.settings = settings
        self.node = settings.node_name
        self.clock = clock
        self.buffer: deque[NodeSample] = deque(maxlen=MAX_BUFFERED_SAMPLES)
        self.written = 0
        self.outage = Outage(log, "writing the GPU history")
        """Its writes failing (its disk full, the store away): said once until one succeeds."""

    def attach(self, ingest: SampleIngest):
        """Take this node's samples as they come; returns the call that stops it."""
        return ingest.subscribe(self.take)

    def take(self, sample: NodeSample) -> None:
        if sample.sample.node == self.node:
            self.buffer.append(sample)

    async def flush(self) -> int:
        """Write the buffered samples; returns how many points were written."""
        if not self.buffer:
            return 0
        samples, self.buffer = list(self.buffer), deque(maxlen=MAX_BUFFERED_SAMPLES)
        points = [
            GpuPoint.raw(s.sample.node, reading, s.taken_at, s.sample.interval_seconds)
            for s in samples
            for reading in s.sample.gpus
            if not reading.lost
        ]
        try:
            await self.history.add(points)
        except (
            Exception
        ):  # kept for the next try, before those taken meanwhile (the oldest go past the bound)
            self.buffer = deque([*samples, *self.buffer], maxlen=MAX_BUFFERED_SAMPLES)
            raise
        self.written += len(points)
        return len(points)

    async def write_once(self, *, compact: bool) -> bool:
        """One beat: write the buffered samples, then compact when `compact`; whether it compacted (or tried
        to). A failure (the history's disk full, its lock held, the store away) keeps the samples for the next
        beat and is said once until a write succeeds again, then that it resumed; a beat with nothing to
        write says neither."""
        tried = False
        try:
            wrote = await self.flush() > 0
            if compact:
                tried = True
                await self.compact()
                wrote = True
        except Exception as exc:  # the history busy or away for a moment: the next beat tries again
            self.outage.failed(exc)
            return tried
        if wrote:
            self.outage.succeeded()
        return tried

    async def compact(self) -> None:
        s = self.settings
        done = await self.history.compact(
            now=self.clock(),
            raw_keep=s.history_raw_keep,
            bucket=s.history_bucket,
            keep=s.history_keep,
            node=self.node,
        )
        if done.merged or done.dropped:
            log.debug("GPU history: %d samples merged, %d old points dropped", done.merged, done.dropped)

    async def run(self) -> None:
        flush_every, compact_every = self.settings.history_flush_interval, self.settings.history_bucket
        last_compact = 0.0
        try:
            while True:
                await asyncio.sleep(flush_every)
                if await self.write_once(compact=time.monotonic() - last_compact >= compact_every):
                    last_compact = time.monotonic()
        finally:
            try:
                await self.flush()
            except Exception as exc:
                log.warning("the last samples were not written to the GPU history: %s", exc)


async def open_history(settings: MonitorSettings) -> GpuHistory:
    """The GPU history of the event store (`gpu_history.db` beside SQLite, or collections of its MongoDB
    database), tried again while it cannot be opened (MongoDB away when the monitor starts): sampling,
    /metrics and alerts go on meanwhile."""
    wait = 1.0
    while True:
        try:
            return await open_gpu_history(
                settings.store_url, raw_keep=settings.history_raw_keep, keep=settings.history_keep
            )
        except Exception as exc:
            log.warning("no GPU history yet: %s; trying again in %.0f s", exc, wait)
        await asyncio.sleep(wait)
        wait = min(2 * wait, HISTORY_RETRY_MAX)


async def keep_history(settings: MonitorSettings, ingest: SampleIngest) -> None:
    """Write this node's samples to the GPU history until cancelled (`HistoryWriter`)."""
    history = await open_history(settings)
    writer = HistoryWriter(history, settings)
    stop = writer.attach(ingest)
    try:
        await writer.run()
    finally:
        stop()
        await history.close()
