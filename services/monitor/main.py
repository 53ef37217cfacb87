"""The monitor service, one per node: samples the node's GPUs every `sample_interval` and publishes each sample
as one `gpu.sample` (every GPU of the node), takes in every node's samples (`ingest.py`), keeps the live jobs
from the event store (`jobs.py`: the holders of each GPU, the platform figures), serves Prometheus `/metrics`
(`metrics.py`), writes its node's samples to the GPU history (`history.py`), and marks its node's GPUs
unhealthy from their samples (`health.py`). docs/monitor.md says what it
does and what it exports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpuyard.services.monitor.alertservice import run_alerts
from gpuyard.services.monitor.ended import EndedFeed
from gpuyard.services.monitor.health import HealthMarker
from gpuyard.services.monitor.history import HistoryWriter
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.jobs import LiveJobs
from gpuyard.services.monitor.metrics import METRICS_PATH, GuardedMetricsServer, make_registry
from gpuyard.services.monitor.platform import PlatformFigures
from gpuyard.services.monitor.sampler import NodeSampler, choose_sampler
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.bus.permissions import Role, permissions
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuSample
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.gpus.nvml import Nvml
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.stores.events import EndedJob
from gpuyard.shared.stores.gpuhistory.base import GpuHistory, open_gpu_history

log = logging.getLogger(__name__)

HISTORY_RETRY_MAX = 60.0
"""Most seconds between two tries to open the GPU history (the wait doubles from 1 s)."""


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def may_listen_to_samples(settings: MonitorSettings) -> bool:
    """Whether this monitor's bus user may subscribe to `gpu.sample` (any user may, without bus users)."""
    if settings.nats_credentials is None:
        return True
    return any(subject_matches(p, Subject.GPU_SAMPLE.value) for p in permissions(Role.MONITOR).subscribe)


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


class Monitor:
    def __init__(self, service: Service, settings: MonitorSettings, *, nvml: Nvml | None = None):
        self.service = service
        self.settings = settings
        self.node = settings.node_name
        self.cluster = settings.metrics_scope == "cluster"
        self.ingest = SampleIngest()
        self.figures = PlatformFigures(settings.quotas) if self.cluster else None
        self.jobs = (
            LiveJobs(service.store, on_started=self.figures.started if self.figures else None)
            if service.store is not None
            else None
        )
        self.ends = (
            EndedFeed(service.store, self.job_ended) if self.figures and service.store is not None else None
        )
        self.sampler: NodeSampler | None = choose_sampler(settings, nvml)
        self.health = HealthMarker(service, self.node)
        self.health.attach(self.ingest)
        self.metrics: GuardedMetricsServer | None = None
        self.published = 0

    async def run(self) -> None:
        self.serve_metrics()
        if self.cluster:
            await self.listen()
        tasks = [self.service.spawn(self.health.run(), "monitor-health")]
        if self.jobs is not None:
            tasks.append(self.service.spawn(self.follow_jobs(), "monitor-jobs"))
        if self.sampler is not None:
            tasks.append(self.service.spawn(self.sample_forever(), "monitor-sampling"))
            tasks.append(self.service.spawn(self.keep_history(), "monitor-history"))
        try:
            await self.service.stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.metrics is not None:
                await asyncio.to_thread(self.metrics.stop)

    async def keep_history(self) -> None:
        """Write this node's samples to the GPU history until stopped (`history.py`)."""
        history = await open_history(self.settings)
        writer = HistoryWriter(history, self.settings)
        stop = writer.attach(self.ingest)
        try:
            await writer.run()
        finally:
            stop()
            await history.close()

    def serve_metrics(self) -> None:
        registry = make_registry(
            self.ingest,
            self.figures,
            node=None if self.cluster else self.node,
            service=self.service.metrics,
        )
        host, port = self.settings.metrics_host, self.settings.metrics_port
        auth = ScrapeAuth.from_settings(self.settings)  # (a token that cannot be read: every scrape refused)
        try:
            self.metrics = GuardedMetricsServer(registry, host, port, auth=auth, path=METRICS_PATH).start()
        except OSError as exc:  # the port is taken: sampling and publishing go on without /metrics
            log.error("cannot serve /metrics on %s:%d: %s; samples are still published", host, port, exc)
            return
        log.info(
            "Prometheus /metrics on http://%s:%d/metrics, %s",
            host,
            self.metrics.port,
            f"for scrapes with the token of {auth.path}" if auth.path else "open to all (metrics_auth=off)",
        )
        self.service.metrics_served_on(host, self.metrics.port)

    async def listen(self) -> None:
        """Every node's samples from the bus (this node's own come straight from its sampler)."""
        if not may_listen_to_samples(self.settings):
            log.info(
                "the monitor's bus user may not subscribe to %s: /metrics shows this node's GPUs only",
                Subject.GPU_SAMPLE.value,
            )
            return

        async def received(msg) -> None:
            # our own samples too: the one taken in straight from the sampler is passed over (not newer),
            # and one this node's monitor credentials published otherwise is judged for GPU health
            self.ingest.ingest_json(msg.data)

        await self.service.bus.subscribe(Subject.GPU_SAMPLE.value, received)

    async def follow_jobs(self) -> None:
        interval = self.settings.jobs_interval
        while True:
            try:
                await self.jobs.refresh()
                if self.figures is not None and self.ends is not None:
                    await self.ends.poll()
                    queued = [JobState.QUEUED.value]
                    counts = await self.service.store.count_by_tenant(states=queued)
                    oldest = await self.service.store.oldest_by_tenant(states=queued)
                    self.figures.update(self.jobs, counts, oldest)
            except Exception as exc:  # the store away for a moment: the next refresh catches up
                log.warning("reading the live jobs failed: %s", exc)
            await asyncio.sleep(interval)

    def job_ended(self, job: EndedJob) -> None:
        self.figures.job_ended(job, start_seen=self.jobs.ended(job.stream_id))

    async def sample_forever(self) -> None:
        """One sample every `sample_interval`, on a fixed beat: a late sample does not shift the next ones,
        and the beats missed while one was late are skipped, not made up in a burst."""
        interval = self.settings.sample_interval
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
            interval_seconds=self.settings.sample_interval,
        )
        event = make_event(sample, source=self.service.source)
        self.ingest.ingest(event)
        await self.publish(event)

    async def publish(self, event) -> None:
        try:
            ack = await self.service.bus.send(event)
        except Exception as exc:  # NATS away: the next sample tries again (samples are not kept)
            log.debug("gpu.sample not published: %s", exc)
            return
        ack.add_done_callback(_quiet)
        self.published += 1


def _quiet(ack: asyncio.Future) -> None:
    with contextlib.suppress(BaseException):
        ack.exception()  # (retrieved: a sample that was not acknowledged is simply not kept)


async def main(service: Service, settings: MonitorSettings) -> None:
    monitor = Monitor(service, settings)
    # the alert rules, their record, the webhooks; the jobs they watch are the monitor's live jobs
    service.spawn(run_alerts(service, settings, monitor.jobs), "alerts")
    await monitor.run()
