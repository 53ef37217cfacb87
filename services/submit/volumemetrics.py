"""Volumes' size and use as Prometheus figures, per tenant and volume, rendered from a snapshot that `refresh`
replaces whole: a scrape reads that snapshot (work in proportion to the volumes, never a walk of a volume's
files).

Series:
- `gpuyard_volume_size_bytes{tenant, volume}`: what the volume may hold (its size, reserved of the tenant's
  volume quota);
- `gpuyard_volume_used_bytes{tenant, volume}`: what its files held when last measured;
- `gpuyard_volume_quota_bytes{tenant}`: what the tenant's volumes may hold together (`volume_quota`), for each
  tenant that has one and either has volumes or is named in the setting.

The volumes and their sizes come from the volume registry's read model at each refresh. Their use is known
only by measuring their files (`VolumeFiles.usage`: a walk of a folder, a listing of an object store's keys;
jobs write into the volumes they mount and no event says so), so a refresh measures a volume when it is new
to the snapshot, when its stream moved on (an upload or a removal recorded), or when its last measure is older
than `REMEASURE_SECONDS`; the others keep their last measure. A volume deleted is gone at the next refresh.

They name tenants and volumes: serve them only to a scrape that may see every tenant's (the scrape token),
never on an open /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuyard.services.submit.volumefiles import VolumeFiles
from gpuyard.shared.settings.storage import quota_of
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry, VolumeView

log = logging.getLogger(__name__)
REFRESH_SECONDS = 15.0
"""How often `run` reads the registry again (and measures the volumes that changed)."""
REMEASURE_SECONDS = 300.0
"""The oldest a volume's measure may be before a refresh walks its folder again (jobs' writes show by then)."""
LABELS = ("tenant", "volume")


@dataclass(frozen=True, slots=True)
class Measure:
    version: int
    """The volume stream's version when measured."""
    used: int
    at: float
    """`time.monotonic()` of the measure."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    volumes: tuple[VolumeView, ...] = ()
    used: dict[tuple[str, str], Measure] = field(default_factory=dict)
    """(tenant, volume) -> its last measure; a volume that could not be measured yet has none."""
    quotas: dict[str, int] = field(default_factory=dict)
    """tenant -> its volume quota in bytes, for the tenants that have one."""


class VolumeMetrics:
    """The volume figures, the collector of a registry of their own (`registry`)."""

    def __init__(self, volumes: VolumeRegistry, files: VolumeFiles, quotas: dict[str, int]):
        self.volumes = volumes
        self.files = files
        self.quotas = quotas
        """`volume_quota`: tenant (or `*`) -> bytes."""
        self.snapshot = Snapshot()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    async def run(self, interval: float = REFRESH_SECONDS) -> None:
        """Refresh every `interval` seconds, for ever; a refresh that fails is logged, the last snapshot kept."""
        while True:
            try:
                await self.refresh()
            except Exception:  # (the store away for a moment: the next refresh tries again)
                log.exception("cannot refresh the volumes' figures; the last ones stay")
            await asyncio.sleep(interval)

    async def refresh(self, now: float | None = None) -> None:
        """A new snapshot: every volume of the registry, measured again where it changed or its measure is old."""
        now = time.monotonic() if now is None else now
        views = tuple(await self.volumes.listed(None))
        known, used = self.snapshot.used, {}
        for view in views:
            key = (view.tenant, view.name)
            measure = known.get(key)
            if measure is None or measure.version != view.version or now - measure.at >= REMEASURE_SECONDS:
                measure = await self._measure(view, now) or measure
            if measure is not None:
                used[key] = measure
        tenants = {v.tenant for v in views} | {t for t in self.quotas if t != "*"}
        quotas = {t: q for t in sorted(tenants) if (q := quota_of(self.quotas, t))}
        self.snapshot = Snapshot(views, used, quotas)

    async def _measure(self, view: VolumeView, now: float) -> Measure | None:
        try:
            _, used = await asyncio.to_thread(self.files.usage, view.tenant, view.name)
        except Exception as exc:  # (unreadable for now, whatever the store: its last measure stays, if any)
            log.warning("cannot measure volume %s/%s: %s", view.tenant, view.name, exc)
            return None
        return Measure(view.version, used, now)

    def describe(self) -> list[Metric]:
        return []  # (its series come and go with the volumes: nothing to check at registration)

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot  # (one snapshot, whole, whichever thread scrapes)
        size = GaugeMetricFamily(
            "gpuyard_volume_size_bytes",
            "What the volume may hold: its size, reserved of its tenant's volume quota.",
            labels=LABELS,
        )
        used = GaugeMetricFamily(
            "gpuyard_volume_used_bytes",
            "What the volume's files held when last measured (at most a few minutes ago).",
            labels=LABELS,
        )
        for view in snapshot.volumes:
            size.add_metric([view.tenant, view.name], view.size_bytes)
            measure = snapshot.used.get((view.tenant, view.name))
            if measure is not None:
                used.add_metric([view.tenant, view.name], measure.used)
        quota = GaugeMetricFamily(
            "gpuyard_volume_quota_bytes",
            "What the tenant's volumes may hold together (volume_quota), for a tenant that has one.",
            labels=("tenant",),
        )
        for tenant, limit in snapshot.quotas.items():
            quota.add_metric([tenant], limit)
        yield from (size, used, quota)
