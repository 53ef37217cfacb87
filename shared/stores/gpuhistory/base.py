"""The GPU history: a bounded, downsampled time series of every GPU's figures and holders (docs/monitor.md,
"History and accounting"), behind one interface (`GpuHistory`) with two backends, chosen from the event store
the way `open_store` chooses: `gpu_history.db` beside a SQLite event store (`gpuyard.shared.stores.gpuhistory.sqlite`), or
collections of the event store's own MongoDB database (`gpuyard.shared.stores.gpuhistory.mongo`). `open_gpu_history` opens
it, for the monitors (which write) and the submit API (which reads).

Each monitor writes its own node's samples (`GpuPoint.raw`, one point per GPU per sample), and compacts the
history on a fixed beat (`GpuHistory.compact`): raw points older than `raw_keep` are merged into one point per
GPU per `bucket` (a minute by default), and points older than `keep` are dropped. Its size is bounded by the
number of GPUs, not by time: at most `raw_keep` of samples and `keep / bucket` buckets per GPU. Reads span
every node.

A point covers `seconds` of a GPU's time: its figures are means over those seconds, and each holder's
`used` is its GPU-seconds weighted by utilization (the GPU's utilization × the holder's share × the
seconds), so that merging points (compaction, a coarser `step` in the API) keeps every sum exact.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuyard.shared.contracts.events.nodes import GpuReading
from gpuyard.shared.settings.monitor import MonitorSettings

if TYPE_CHECKING:
    from gpuyard.shared.stores.events import EventStore

HISTORY_FILE = "gpu_history.db"
COMPACT_BATCH = 50_000
"""Most raw points one compaction merges: a compaction's work is bounded; the next one takes the rest."""
ORPHAN_AFTER = 600.0
"""A compaction takes its own node's raw points once they are past `raw_keep`, and another node's once they are
this much older still: that node's monitor is gone (or stuck), and its points must not stay raw."""
DEFAULT_RAW_KEEP: float = MonitorSettings.model_fields["history_raw_keep"].default
DEFAULT_KEEP: float = MonitorSettings.model_fields["history_keep"].default
"""The spans a history assumes when opened without them (to read): the settings' defaults."""


@dataclass(frozen=True, slots=True)
class HolderUse:
    """A job replica's part of a point: how long it held its share, and its utilization-weighted use."""

    job_id: str
    tenant: str
    user: str
    fraction: float
    seconds: float
    """The seconds it held the share within the point."""
    used: float
    """GPU-seconds used: utilization × fraction × seconds, summed."""

    @property
    def allocated(self) -> float:
        """GPU-seconds allocated: fraction × seconds."""
        return self.fraction * self.seconds

    def merged(self, other: HolderUse) -> HolderUse:
        seconds = self.seconds + other.seconds
        fraction = (self.allocated + other.allocated) / seconds if seconds else self.fraction
        return replace(self, fraction=fraction, seconds=seconds, used=self.used + other.used)


@dataclass(frozen=True, slots=True)
class GpuPoint:
    node: str
    gpu: int
    t: float
    seconds: float
    utilization_pct: float | None
    memory_used_bytes: float | None
    memory_total_bytes: int = 0
    holders: tuple[HolderUse, ...] = ()
    bucket: float = 0.0
    util_seconds: float = field(default=0.0)
    """The seconds within `seconds` whose utilization was reported (the weight of the mean)."""

    @classmethod
    def raw(cls, node: str, reading: GpuReading, t: float, seconds: float) -> GpuPoint:
        """One GPU of one sample, covering the sample's interval."""
        util = reading.utilization_pct
        busy = (util or 0.0) / 100
        holders = tuple(
            HolderUse(h.job_id, h.tenant, h.user, h.fraction, seconds, busy * h.fraction * seconds)
            for h in reading.holders
        )
        return cls(
            node=node,
            gpu=reading.index,
            t=t,
            seconds=seconds,
            utilization_pct=util,
            memory_used_bytes=reading.memory_used_bytes,
            memory_total_bytes=reading.memory_total_bytes,
            holders=holders,
            util_seconds=seconds if util is not None else 0.0,
        )

    def holder(self, job_id: str) -> HolderUse | None:
        return next((h for h in self.holders if h.job_id == job_id), None)


def merge(points: list[GpuPoint], *, t: float, bucket: float) -> GpuPoint:
    """One point for several points of the same GPU: times summed, figures averaged over their seconds."""
    first = points[0]
    seconds = sum(p.seconds for p in points)
    util_seconds = sum(p.util_seconds for p in points)
    util = (
        sum(p.utilization_pct * p.util_seconds for p in points if p.utilization_pct is not None)
        / util_seconds
        if util_seconds
        else None
    )
    with_mem = [(p.memory_used_bytes, p.seconds) for p in points if p.memory_used_bytes is not None]
    mem_seconds = sum(seconds for _, seconds in with_mem)
    mem = sum(used * seconds for used, seconds in with_mem) / mem_seconds if mem_seconds else None
    holders: dict[str, HolderUse] = {}
    for p in points:
        for h in p.holders:
            holders[h.job_id] = holders[h.job_id].merged(h) if h.job_id in holders else h
    return GpuPoint(
        node=first.node,
        gpu=first.gpu,
        t=t,
        seconds=seconds,
        utilization_pct=util,
        memory_used_bytes=mem,
        memory_total_bytes=max(p.memory_total_bytes for p in points),
        holders=tuple(holders.values()),
        bucket=bucket,
        util_seconds=util_seconds,
    )


def downsample(points: Iterable[GpuPoint], step: float) -> list[GpuPoint]:
    """The points merged into one per GPU per `step` seconds (aligned on multiples of `step`), by GPU and time."""
    groups: dict[tuple[str, int, float], list[GpuPoint]] = {}
    for p in points:
        groups.setdefault((p.node, p.gpu, math.floor(p.t / step) * step), []).append(p)
    return [merge(group, t=key[2], bucket=step) for key, group in sorted(groups.items())]


@dataclass(frozen=True, slots=True)
class Compacted:
    merged: int
    """Raw points merged into buckets."""
    dropped: int
    """Points older than the history keeps, deleted."""


def compact_cutoff(now: float, raw_keep: float, bucket: float) -> float:
    """The time before which a compaction merges raw points: the start of the bucket that `now - raw_keep`
    falls in (a bucket is merged whole, once all of it is past `raw_keep`)."""
    return math.floor((now - raw_keep) / bucket) * bucket


def holds_tenant(point: GpuPoint, tenant: str | None) -> bool:
    return tenant is None or any(h.tenant == tenant for h in point.holders)


class GpuHistory(ABC):
    """What the monitors and the submit API see of the GPU history, whatever the backend."""

    @classmethod
    async def open(
        cls, where: str | Path, *, raw_keep: float = DEFAULT_RAW_KEEP, keep: float = DEFAULT_KEEP
    ) -> GpuHistory:
        """The history at `where`: a SQLite file (a path), or a MongoDB database (`mongodb://HOST/DB`).
        `raw_keep` and `keep`: MongoDB's expiry of the points no compaction takes (SQLite has none)."""
        if isinstance(where, str) and where.startswith(("mongodb://", "mongodb+srv://")):
            from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

            return await MongoGpuHistory.open(where, raw_keep=raw_keep, keep=keep)
        from gpuyard.shared.stores.gpuhistory.sqlite import SqliteGpuHistory

        return await SqliteGpuHistory.open(Path(where))

    @abstractmethod
    async def add(self, points: list[GpuPoint]) -> None:
        """Store points; one already stored (same GPU, same time, same bucket) is kept as it was (idempotent)."""

    @abstractmethod
    async def compact(
        self,
        *,
        now: float,
        raw_keep: float,
        bucket: float,
        keep: float,
        node: str | None = None,
        limit: int = COMPACT_BATCH,
    ) -> Compacted:
        """Raw points older than `raw_keep` merged into `bucket` points, oldest first, up to `limit` of them (a
        bucket already stored takes the new ones in, and a raw point is never counted twice in its bucket),
        then every point older than `keep` dropped. With `node`: that node's raw points, and another node's
        only once ORPHAN_AFTER older still."""

    @abstractmethod
    async def points(
        self,
        *,
        since: float,
        until: float | None = None,
        node: str | None = None,
        job_id: str | None = None,
        tenant: str | None = None,
    ) -> list[GpuPoint]:
        """The points from `since` (to `until`), of every node, or only those of one node, of one job's GPUs,
        or of the GPUs one tenant's jobs held, when given; by time, node and GPU."""

    @abstractmethod
    async def count(self) -> dict[float, int]:
        """How many points are stored, by bucket (0: raw)."""

    @abstractmethod
    async def close(self) -> None: ...


def history_path_beside(events_db: Path) -> Path:
    """The GPU history of a SQLite event store: `gpu_history.db` in the same directory."""
    return events_db.with_name(HISTORY_FILE)


async def open_gpu_history(
    store: str | EventStore, *, raw_keep: float = DEFAULT_RAW_KEEP, keep: float = DEFAULT_KEEP
) -> GpuHistory:
    """The GPU history of an event store, given by its URL or open: `gpu_history.db` beside a SQLite store, or
    the same MongoDB database (an open MongoDB store lends its client, which the history does not close).
    `raw_keep`, `keep`: the writer's settings (MongoDB's backstop expiry of the points no compaction takes).
    StoreUnavailable when it cannot be reached; ValueError for a URL of neither."""
    if not isinstance(store, str):
        from gpuyard.shared.stores.events.sqlite import SqliteEventStore

        if isinstance(store, SqliteEventStore):
            return await GpuHistory.open(history_path_beside(Path(store.path)))
        from gpuyard.shared.stores.events.mongo import MongoEventStore
        from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

        if isinstance(store, MongoEventStore):
            return await MongoGpuHistory.on(store.client, store.db.name, raw_keep=raw_keep, keep=keep)
        raise ValueError(f"no GPU history for an event store of type {type(store).__name__}")
    if store.startswith("sqlite:///"):
        return await GpuHistory.open(history_path_beside(Path(store.removeprefix("sqlite:///"))))
    if store.startswith(("mongodb://", "mongodb+srv://")):
        return await GpuHistory.open(store, raw_keep=raw_keep, keep=keep)
    raise ValueError(f"unknown event store URL {store!r}: use sqlite:///PATH or mongodb://HOST/DB")
