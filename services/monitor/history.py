"""The monitor's part of the GPU history (`shared.gpuhistory`): it writes its own node's samples, and compacts.

Every monitor writes the samples of its own node only: each point has one writer (no lease to wait for, no
point written twice by two monitors), the writes grow with the node, not with the cluster, and a node's
history does not depend on the bus carrying its samples to another monitor. The samples come from the
monitor's `SampleIngest` (`subscribe`): they are buffered, written every `history_flush_interval` in one
write, and the history is compacted every `history_bucket`: this node's old samples, and another node's once
they are older still (`ORPHAN_AFTER`: a node gone for good leaves none behind); with MongoDB, several monitors
compacting the same samples never count one twice (`shared.gpuhistory_mongo`). The buffer is bounded: if the
history cannot be written for long, the oldest samples are dropped, never the sampling held up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from services.monitor.ingest import NodeSample, SampleIngest
from shared.gpuhistory import GpuHistory, GpuPoint
from shared.settings import MonitorSettings

log = logging.getLogger(__name__)

MAX_BUFFERED_SAMPLES = 3600
"""Samples kept while the history cannot be written (an hour at 1 Hz); older ones are dropped."""


class HistoryWriter:
    def __init__(self, history: GpuHistory, settings: MonitorSettings, *, clock=time.time):
        self.history = history
        self.settings = settings
        self.node = settings.node_name
        self.clock = clock
        self.buffer: deque[NodeSample] = deque(maxlen=MAX_BUFFERED_SAMPLES)
        self.written = 0

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
                try:
                    await self.flush()
                    if time.monotonic() - last_compact >= compact_every:
                        last_compact = time.monotonic()
                        await self.compact()
                except Exception as exc:  # the history busy or away for a moment: the next beat tries again
                    log.warning("writing the GPU history failed: %s", exc)
        finally:
            try:
                await self.flush()
            except Exception as exc:
                log.warning("the last samples were not written to the GPU history: %s", exc)
