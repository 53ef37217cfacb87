"""The node's sampling: its GPUs read every `sample_interval` (`sampler.py`), with the holders of each GPU
from the live jobs, as one `gpu.sample` of the whole node, taken in straight away (`SampleIngest`: no round trip
through the bus) and published.

The beat is fixed: a late sample does not shift the next ones, and the beats missed while one was late are
skipped, not made up in a burst. A sample that cannot be read or published is not kept: the next one says
the same, newer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.jobs import LiveJobs
from gpuyard.services.monitor.sampler import NodeSampler
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.nodes import GpuSample
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.monitor import MonitorSettings

log = logging.getLogger(__name__)


class Sampling:
    def __init__(
        self,
        service: Service,
        settings: MonitorSettings,
        sampler: NodeSampler,
        ingest: SampleIngest,
        jobs: LiveJobs | None,
    ):
        """`jobs`: the live jobs, whose placements on this node are the holders of its GPUs (None: no store,
        no holders)."""
        self.service = service
        self.node = settings.node_name
        self.interval = settings.sample_interval
        self.sampler = sampler
        self.ingest = ingest
        self.jobs = jobs
        self.published = 0

    async def run(self) -> None:
        """One sample every `sample_interval`, on a fixed beat, until cancelled."""
        interval = self.interval
        beat = time.monotonic()
        while True:
            try:
                await self.sample_once()
            except Exception as exc:  # a driver hiccup must not stop the sampling
                log.warning("sampling the GPUs failed: %s", exc)
            beat += interval
            now = time.monotonic()
            if beat <= now:
                beat += ((now - beat) // interval + 1) * interval
            await asyncio.sleep(beat - now)

    async def sample_once(self) -> None:
        held = self.jobs.held_on(self.node) if self.jobs is not None and self.jobs.refreshed else []
        readings = await asyncio.to_thread(self.sampler.read, held)
        sample = GpuSample(
            node=self.node,
            gpus=readings,
            simulated=self.sampler.is_simulated,
            interval_seconds=self.interval,
        )
        event = make_event(sample, source=self.service.source)
        self.ingest.ingest(event)
        await self.publish(event)

    async def publish(self, event: CloudEvent) -> None:
        bus = self.service.bus
        try:
            ack = await bus.send(event)
        except Exception as exc:  # NATS away: the next sample tries again (samples are not kept)
            log.debug("gpu.sample not published: %s", exc)
            return
        ack.add_done_callback(_quiet)
        self.published += 1


def _quiet(ack: asyncio.Future) -> None:
    with contextlib.suppress(BaseException):
        ack.exception()  # (retrieved: a sample that was not acknowledged is simply not kept)
