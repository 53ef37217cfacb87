"""The GPU history: a bounded, downsampled time series of every GPU's figures and holders (docs/monitor.md,
"History and accounting").

Each monitor writes its own node's samples (`GpuPoint.raw`, one point per GPU per sample) to `gpu_history.db`
beside the SQLite event store, and compacts the history on a fixed beat (`GpuHistory.compact`): raw points
older than `raw_keep` are merged into one point per GPU per `bucket` (a minute by default), and bucket points
older than `keep` are dropped. Its size is bounded by the number of GPUs, not by time: at most `raw_keep`
of samples and `keep / bucket` buckets per GPU.

A point covers `seconds` of a GPU's time: its figures are means over those seconds, and each holder's
`used` is its GPU-seconds weighted by utilization (the GPU's utilization × the holder's share × the
seconds), so that merging points (compaction, a coarser `step` in the API) keeps every sum exact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from shared.events import GpuReading
from shared.sqlitefile import SqliteFile

HISTORY_FILE = "gpu_history.db"
COMPACT_BATCH = 50_000
"""Most raw points one compaction merges: a compaction's work is bounded; the next one takes the rest."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS gpu_points (
    bucket  REAL    NOT NULL,  -- 0: a raw sample; else the seconds of the bucket the point stands for
    node    TEXT    NOT NULL,
    gpu     INTEGER NOT NULL,
    t       REAL    NOT NULL,  -- the sample's time, or the bucket's start (seconds since the epoch)
    seconds REAL    NOT NULL,  -- the GPU time the point covers
    util    REAL,              -- mean utilization, percent (NULL: not reported)
    util_seconds REAL NOT NULL,  -- the seconds the utilization was reported for
    mem     REAL,              -- mean memory used, bytes
    mem_total INTEGER NOT NULL,
    holders TEXT    NOT NULL,  -- JSON list of HolderUse
    jobs    TEXT    NOT NULL,  -- ' job1 job2 ': the holders' job ids, for a job's points
    PRIMARY KEY (bucket, node, gpu, t)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gpu_points_t ON gpu_points (t);
"""


def history_path_beside(events_db: Path) -> Path:
    """The GPU history of a SQLite event store: `gpu_history.db` in the same directory."""
    return events_db.with_name(HISTORY_FILE)


def history_path_of_url(store_url: str) -> Path | None:
    """The history beside an event store URL; None for a MongoDB store (no MongoDB adapter yet)."""
    if store_url.startswith("sqlite:///"):
        return history_path_beside(Path(store_url.removeprefix("sqlite:///")))
    return None


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
    with_mem = [p for p in points if p.memory_used_bytes is not None]
    mem_seconds = sum(p.seconds for p in with_mem)
    mem = sum(p.memory_used_bytes * p.seconds for p in with_mem) / mem_seconds if mem_seconds else None
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


def _holders_json(holders: tuple[HolderUse, ...]) -> str:
    return json.dumps([[h.job_id, h.tenant, h.user, h.fraction, h.seconds, h.used] for h in holders])


def _row(p: GpuPoint) -> tuple:
    jobs = " " + " ".join(h.job_id for h in p.holders) + " " if p.holders else ""
    return (
        p.bucket,
        p.node,
        p.gpu,
        p.t,
        p.seconds,
        p.utilization_pct,
        p.util_seconds,
        p.memory_used_bytes,
        p.memory_total_bytes,
        _holders_json(p.holders),
        jobs,
    )


COLUMNS = "bucket, node, gpu, t, seconds, util, util_seconds, mem, mem_total, holders, jobs"


def _point(row: tuple) -> GpuPoint:
    bucket, node, gpu, t, seconds, util, util_seconds, mem, mem_total, holders, _ = row
    return GpuPoint(
        node=node,
        gpu=gpu,
        t=t,
        seconds=seconds,
        utilization_pct=util,
        memory_used_bytes=mem,
        memory_total_bytes=mem_total,
        holders=tuple(HolderUse(*h) for h in json.loads(holders)),
        bucket=bucket,
        util_seconds=util_seconds,
    )


@dataclass(frozen=True, slots=True)
class Compacted:
    merged: int
    """Raw points merged into buckets."""
    dropped: int
    """Points older than the history keeps, deleted."""


class GpuHistory(SqliteFile):
    """The SQLite GPU history. Writes go through one thread, reads through another (`shared.sqlitefile`)."""

    WHAT = "the GPU history"
    SCHEMA = SCHEMA
    THREAD = "history"

    async def add(self, points: list[GpuPoint]) -> None:
        """Store points; one already stored (same GPU, same time) is kept as it was (idempotent)."""
        if not points:
            return
        rows = [_row(p) for p in points]

        def write() -> None:
            with self._write_conn:
                self._write_conn.execute("BEGIN IMMEDIATE")
                self._write_conn.executemany(
                    f"INSERT OR IGNORE INTO gpu_points ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows
                )

        await self._on(self._writer, write)

    async def compact(
        self, *, now: float, raw_keep: float, bucket: float, keep: float, limit: int = COMPACT_BATCH
    ) -> Compacted:
        """Raw points older than `raw_keep` merged into `bucket` points (up to `limit` of them; a bucket
        already stored takes the new ones in), then every point older than `keep` dropped; one transaction."""
        cutoff = math.floor((now - raw_keep) / bucket) * bucket

        def work() -> Compacted:
            conn = self._write_conn
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                rows = conn.execute(
                    f"SELECT {COLUMNS} FROM gpu_points WHERE bucket = 0 AND t < ? ORDER BY t LIMIT ?",
                    (cutoff, limit),
                ).fetchall()
                raw = [_point(r) for r in rows]
                merged = downsample(raw, bucket)
                for i, point in enumerate(merged):
                    held = conn.execute(
                        f"SELECT {COLUMNS} FROM gpu_points WHERE bucket = ? AND node = ? AND gpu = ? AND t = ?",
                        (bucket, point.node, point.gpu, point.t),
                    ).fetchone()
                    if held is not None:
                        merged[i] = merge([_point(held), point], t=point.t, bucket=bucket)
                conn.executemany(
                    f"INSERT OR REPLACE INTO gpu_points ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    [_row(p) for p in merged],
                )
                conn.executemany(
                    "DELETE FROM gpu_points WHERE bucket = 0 AND node = ? AND gpu = ? AND t = ?",
                    [(p.node, p.gpu, p.t) for p in raw],
                )
                dropped = conn.execute("DELETE FROM gpu_points WHERE t < ?", (now - keep,)).rowcount
            return Compacted(merged=len(raw), dropped=dropped)

        return await self._on(self._writer, work)

    async def points(
        self,
        *,
        since: float,
        until: float | None = None,
        node: str | None = None,
        job_id: str | None = None,
    ) -> list[GpuPoint]:
        """The points from `since` (to `until`), of one node or one job's GPUs when given, by time."""
        where, args = ["t >= ?"], [since]
        if until is not None:
            where.append("t < ?")
            args.append(until)
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if job_id is not None:
            where.append("instr(jobs, ?) > 0")
            args.append(f" {job_id} ")
        sql = f"SELECT {COLUMNS} FROM gpu_points WHERE {' AND '.join(where)} ORDER BY t, node, gpu"

        def read() -> list[GpuPoint]:
            return [_point(r) for r in self._read_conn.execute(sql, args).fetchall()]

        return await self._on(self._reader, read)

    async def count(self) -> dict[float, int]:
        """How many points are stored, by bucket (0: raw)."""

        def read() -> dict[float, int]:
            rows = self._read_conn.execute("SELECT bucket, COUNT(*) FROM gpu_points GROUP BY bucket")
            return {b: n for b, n in rows.fetchall()}

        return await self._on(self._reader, read)
