"""Prometheus `/metrics`: the GPUs under the DCGM exporter's names, help texts and labels, the platform's
figures, and the monitor's own.

Custom collectors render the current snapshot at each scrape (`SampleIngest.snapshot()`,
`PlatformFigures.snapshot`): no label-set object is kept per GPU or per tenant between scrapes, so a GPU, a
node or a tenant that goes away leaves no series behind.

GPU series are labelled as the DCGM exporter labels them (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`hostname`), plus `job`, `tenant` and `user` of the replica placed on the GPU (empty when none; comma-joined
when several share it). `gpuyard_gpu_holder_info` has one series per holder.

Those labels name every tenant's jobs and users, which `/v1/nodes` blanks for other tenants: /metrics answers a
scrape that carries the scrape token only (`GuardedMetricsServer`, `gpuyard.shared.auth.secretfile.ScrapeAuth`; 401
otherwise), unless `metrics_auth=off`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.platform import PlatformFigures
from gpuyard.shared.auth.secretfile import CHALLENGE, REFUSED, ScrapeAuth
from gpuyard.shared.contracts.events.nodes import GpuReading
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.runtime.servicemetrics import MetricsServer
from gpuyard.shared.settings.monitor import MonitorSettings

__all__ = ["METRICS_PATH", "GuardedMetricsServer", "MetricsServer", "make_registry"]

log = logging.getLogger(__name__)

MIB = 1 << 20
METRICS_PATH = "/metrics"
"""The DCGM exporter's path (`MetricsServer(registry, host, port, path=METRICS_PATH)`)."""


def _mib(value: int | None) -> float | None:
    return None if value is None else float(round(value / MIB))


def _free(g: GpuReading) -> float | None:
    if g.memory_used_bytes is None or not g.memory_total_bytes:
        return None
    return _mib(max(0, g.memory_total_bytes - g.memory_used_bytes))


@dataclass(frozen=True)
class GpuSeries:
    name: str
    help: str
    value: Callable[[GpuReading], float | int | None]


DCGM_SERIES = (
    GpuSeries("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_pct),
    GpuSeries("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.memory_util_pct),
    GpuSeries(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: _mib(g.memory_used_bytes)
    ),
    GpuSeries("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    GpuSeries("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    GpuSeries("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    GpuSeries("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    GpuSeries("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.memory_clock_mhz),
    GpuSeries(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        lambda g: g.last_xid or 0,  # 0: none seen
    ),
    GpuSeries(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        lambda g: g.ecc_corrected,
    ),
    GpuSeries(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        lambda g: g.ecc_uncorrected,
    ),
    GpuSeries("gpuyard_gpu_power_limit_watts", "Enforced power limit (in W).", lambda g: g.power_limit_w),
    GpuSeries(
        "gpuyard_gpu_lost", "1 when NVML reports the GPU lost (fallen off the bus).", lambda g: int(g.lost)
    ),
)
"""The GPU series: the DCGM exporter's (its names and help texts), then GPUYard's. The ECC totals, which the
exporter types `counter`, are typed `gauge` here: prometheus-client writes a counter's name with `_total`
added, and the series must keep the exporter's exact names (PromQL's rate() works on either type)."""


def _joined(values: list[str]) -> str:
    return ",".join(sorted(set(values)))


class GpuCollector:
    """Every GPU of every node whose sample is fresh (`scope`: 'node' keeps this node's only)."""

    def __init__(self, ingest: SampleIngest, *, node: str | None = None):
        self.ingest = ingest
        self.node = node

    def collect(self) -> Iterator[Metric]:
        families = []
        for series in DCGM_SERIES:
            metric = Metric(series.name, series.help, "gauge")
            families.append((series, metric))
        holders = GaugeMetricFamily(
            "gpuyard_gpu_holder_info",
            "A job replica placed on the GPU (1 per holder), with its share.",
            labels=("gpu", "UUID", "hostname", "job", "tenant", "user", "replica", "fraction"),
        )
        age = GaugeMetricFamily(
            "gpuyard_node_sample_age_seconds",
            "Seconds since the node's latest GPU sample.",
            labels=("hostname",),
        )
        count = GaugeMetricFamily(
            "gpuyard_node_gpus", "GPUs of the node in its latest sample.", labels=("hostname", "simulated")
        )
        now = self.ingest.clock()
        for held in self.ingest.snapshot():
            sample = held.sample
            if self.node is not None and sample.node != self.node:
                continue
            age.add_metric([sample.node], max(0.0, now - held.taken_at))
            count.add_metric([sample.node, str(sample.simulated).lower()], len(sample.gpus))
            for g in sample.gpus:
                labels = {
                    "gpu": str(g.index),
                    "UUID": g.uuid,
                    "pci_bus_id": g.pci_bus_id,
                    "device": f"nvidia{g.index}",
                    "modelName": g.model,
                    "hostname": sample.node,
                    "job": _joined([h.job_id for h in g.holders]),
                    "tenant": _joined([h.tenant for h in g.holders]),
                    "user": _joined([h.user for h in g.holders]),
                }
                for series, metric in families:
                    value = series.value(g)
                    if value is not None:
                        metric.add_sample(series.name, labels, float(value))
                for h in g.holders:
                    holders.add_metric(
                        [
                            str(g.index),
                            g.uuid,
                            sample.node,
                            h.job_id,
                            h.tenant,
                            h.user,
                            str(h.replica),
                            f"{h.fraction:g}",
                        ],
                        1,
                    )
        yield from (metric for _, metric in families)
        yield holders
        yield age
        yield count


class PlatformCollector:
    """Jobs, queues, quotas and the submit→running wait, from the latest `PlatformFigures` snapshot."""

    def __init__(self, figures: PlatformFigures):
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        snap = self.figures.snapshot
        jobs = GaugeMetricFamily("gpuyard_jobs", "Live jobs by state and tenant.", labels=("state", "tenant"))
        for (state, tenant), n in sorted(snap.jobs.items()):
            jobs.add_metric([state, tenant], n)
        yield jobs
        length = GaugeMetricFamily("gpuyard_queue_length", "Queued jobs of the tenant.", labels=("tenant",))
        oldest = GaugeMetricFamily(
            "gpuyard_queue_oldest_wait_seconds",
            "Seconds the tenant's oldest queued job has waited since it was submitted.",
            labels=("tenant",),
        )
        for tenant, queue in sorted(snap.queues.items()):
            length.add_metric([tenant], queue.length)
            oldest.add_metric([tenant], queue.oldest_wait_seconds)
        yield length
        yield oldest
        quota = {
            part: GaugeMetricFamily(f"gpuyard_quota_{part}_gpus", text, labels=("tenant",))
            for part, text in (
                ("guaranteed", "GPUs guaranteed to the tenant (its quota)."),
                ("used", "GPUs the tenant's placed and running jobs hold."),
                ("borrowed", "GPUs the tenant holds beyond its quota, on other tenants' idle quota."),
            )
        }
        for tenant, q in sorted(snap.quotas.items()):
            quota["guaranteed"].add_metric([tenant], q.guaranteed)
            quota["used"].add_metric([tenant], q.used)
            quota["borrowed"].add_metric([tenant], q.borrowed)
        yield from quota.values()
        ended = CounterMetricFamily(
            "gpuyard_jobs_ended",
            "Jobs that reached a final state since the monitor started.",
            labels=("state", "tenant"),
        )
        for (state, tenant), n in sorted(snap.ended.items()):
            ended.add_metric([state, tenant], n)
        yield ended
        buckets, total = self.figures.start_wait.buckets()
        yield HistogramMetricFamily(
            "gpuyard_job_start_wait_seconds",
            "Seconds from a job's submit to its first start (jobs seen starting since the monitor started).",
            buckets=buckets,
            sum_value=total,
        )


class IngestCollector:
    """The monitor's own figures."""

    def __init__(self, ingest: SampleIngest):
        self.ingest = ingest

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "gpuyard_monitor_samples_ingested", "gpu.sample events taken in.", value=self.ingest.ingested
        )
        yield CounterMetricFamily(
            "gpuyard_monitor_samples_ignored",
            "gpu.sample events passed over (duplicates, older than the node's latest, unreadable).",
            value=self.ingest.ignored,
        )
        yield GaugeMetricFamily(
            "gpuyard_monitor_ingest_lag_seconds",
            "Seconds between the latest sample's time and its arrival here.",
            value=self.ingest.last_lag,
        )


def make_registry(
    ingest: SampleIngest,
    figures: PlatformFigures | None,
    *,
    node: str | None = None,
    service: CollectorRegistry | None = None,
) -> CollectorRegistry:
    """`figures` None: no platform figures; `node`: that node's GPUs only; `service`: the monitor process's
    own figures (`gpuyard.shared.runtime.servicemetrics`: process, bus consumers), served with the rest."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(ingest, node=node))
    if figures is not None:
        registry.register(PlatformCollector(figures))
    registry.register(IngestCollector(ingest))
    if service is not None:
        registry.register(service)  # (a registry is a collector: its figures are collected at each scrape)
    return registry


class GuardedMetricsServer(MetricsServer):
    """`MetricsServer` whose path answers only the scrapes `auth` allows: 401 with a bearer challenge, and
    nothing of the figures, to any other."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, auth: ScrapeAuth, path: str):
        super().__init__(registry, host, port, path=path)
        self.auth = auth
        self.guarded_path = path

    def refused(self, request: BaseHTTPRequestHandler) -> bool:
        if request.path.split("?")[0] != self.guarded_path or self.auth.allows(
            request.headers.get("Authorization")
        ):
            return False
        refusal = (REFUSED + "\n").encode()
        request.send_response(401)
        request.send_header("WWW-Authenticate", CHALLENGE)
        request.send_header("Content-Type", "text/plain; charset=utf-8")
        request.send_header("Content-Length", str(len(refusal)))
        request.end_headers()
        request.wfile.write(refusal)
        return True


def serve_metrics(
    service: Service, settings: MonitorSettings, ingest: SampleIngest, figures: PlatformFigures | None
) -> GuardedMetricsServer | None:
    """The monitor's /metrics on `metrics_host:metrics_port`, started: every node's GPUs and the platform's
    `figures` in a cluster-scope monitor, its own node's GPUs otherwise, and the process's own figures. None
    when the port is taken: sampling and publishing go on without /metrics."""
    registry = make_registry(
        ingest,
        figures,
        node=None if settings.metrics_scope == "cluster" else settings.node_name,
        service=service.metrics,
    )
    host, port = settings.metrics_host, settings.metrics_port
    auth = ScrapeAuth.from_settings(settings)  # (a token that cannot be read: every scrape refused)
    try:
        server = GuardedMetricsServer(registry, host, port, auth=auth, path=METRICS_PATH).start()
    except OSError as exc:  # the port is taken: sampling and publishing go on without /metrics
        log.error("cannot serve /metrics on %s:%d: %s; samples are still published", host, port, exc)
        return None
    log.info(
        "Prometheus /metrics on http://%s:%d/metrics, %s",
        host,
        server.port,
        f"for scrapes with the token of {auth.path}" if auth.path else "open to all (metrics_auth=off)",
    )
    service.metrics_served_on(host, server.port)
    return server
