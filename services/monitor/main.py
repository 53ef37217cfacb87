"""The monitor service, one per node: samples the node's GPUs every `sample_interval` and publishes each sample
as one `gpu.sample` (every GPU of the node: `sampling.py`), takes in every node's samples (`ingest.py`), keeps
the live jobs from the event store (`jobs.py`, refreshed by `refresher.py`: the holders of each GPU, the
platform figures), serves Prometheus `/metrics` (`metrics.py`), writes its node's samples to the GPU history
(`history.py`), marks its node's GPUs unhealthy from their samples (`health.py`), and runs the alert rules
(`alertservice.py`). docs/monitor.md says what it does and what it exports.
"""

from __future__ import annotations

import asyncio
import logging

from gpuyard.services.monitor.alertservice import run_alerts
from gpuyard.services.monitor.health import HealthMarker
from gpuyard.services.monitor.history import keep_history
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.jobs import LiveJobs
from gpuyard.services.monitor.metrics import GuardedMetricsServer, serve_metrics
from gpuyard.services.monitor.platform import PlatformFigures
from gpuyard.services.monitor.refresher import JobsRefresher
from gpuyard.services.monitor.sampler import choose_sampler
from gpuyard.services.monitor.sampling import Sampling
from gpuyard.shared.bus.permissions import Role, may_subscribe
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.gpus.nvml import Nvml
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.monitor import MonitorSettings

log = logging.getLogger(__name__)


def may_listen_to_samples(settings: MonitorSettings) -> bool:
    """Whether this monitor's bus user may subscribe to `gpu.sample` (any user may, without bus users)."""
    return settings.nats_credentials is None or may_subscribe(Role.MONITOR, Subject.GPU_SAMPLE.value)


class Monitor:
    def __init__(self, service: Service, settings: MonitorSettings, *, nvml: Nvml | None = None):
        self.service = service
        self.settings = settings
        self.cluster = settings.metrics_scope == "cluster"
        self.ingest = SampleIngest()
        self.figures = PlatformFigures(settings.quotas) if self.cluster else None
        self.jobs = LiveJobs(service.store, on_started=self.figures.started if self.figures else None)
        self.refresher = JobsRefresher(service.store, self.jobs, settings.jobs_interval, self.figures)
        sampler = choose_sampler(settings, nvml)
        self.sampling = (
            None if sampler is None else Sampling(service, settings, sampler, self.ingest, self.jobs)
        )
        self.health = HealthMarker(service, settings.node_name)
        self.health.attach(self.ingest)
        self.metrics: GuardedMetricsServer | None = None

    async def run(self) -> None:
        self.metrics = serve_metrics(self.service, self.settings, self.ingest, self.figures)
        if self.cluster:
            await self.listen()
        spawn = self.service.spawn
        tasks = [spawn(self.health.run(), "monitor-health"), spawn(self.refresher.run(), "monitor-jobs")]
        if self.sampling is not None:
            tasks.append(spawn(self.sampling.run(), "monitor-sampling"))
            tasks.append(spawn(keep_history(self.settings, self.ingest), "monitor-history"))
        try:
            await self.service.stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.metrics is not None:
                await asyncio.to_thread(self.metrics.stop)

    async def listen(self) -> None:
        """Every node's samples from the bus (this node's own come straight from its sampler)."""
        if not may_listen_to_samples(self.settings):
            log.info(
                "the monitor's bus user may not subscribe to %s: /metrics shows this node's GPUs only",
                Subject.GPU_SAMPLE.value,
            )
            return
        # A core subscription to the raw messages, not a HandlerTable: `gpu.sample` is the telemetry path
        # (every node's sample, every second, live: not stored, nothing to acknowledge), which the ingest
        # decodes itself (`SampleIngest.on_message`). Our own samples come back too: passed over, not newer
        # than the one taken in from the sampler; one this node's monitor credentials published otherwise is
        # judged for GPU health.
        await self.service.bus.subscribe(Subject.GPU_SAMPLE.value, self.ingest.on_message)


async def main(service: Service, settings: MonitorSettings) -> None:
    monitor = Monitor(service, settings)
    # the alert rules, their record, the webhooks; the jobs they watch are the monitor's live jobs
    service.spawn(run_alerts(service, settings, monitor.jobs), "alerts")
    await monitor.run()
