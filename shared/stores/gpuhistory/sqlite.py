"""The GPU history in a SQLite file beside the SQLite event store (`gpu_history.db`; `gpuyard.shared.stores.gpuhistory.base`): one
table of raw and bucket points, a compaction in one transaction (the raw points it merges are deleted in the
same transaction that writes their buckets, so none is ever counted twice)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Self

from gpuyard.shared.stores.gpuhistory.base import (
    COMPACT_BATCH,
    DEFAULT_KEEP,
    DEFAULT_RAW_KEEP,
    ORPHAN_AFTER,
    Compacted,
    GpuHistory,
    GpuPoint,
    HolderUse,
    compact_cutoff,
    downsample,
    holds_tenant,
    merge,
)
from gpuyard.shared.stores.sqlitefile import SqliteFile

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
COLUMNS = "bucket, node, gpu, t, seconds, util, util_seconds, mem, mem_total, holders, jobs"


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


class SqliteGpuHistory(SqliteFile, GpuHistory):
    """The SQLite GPU history. Writes go through one thread, reads through another (`gpuyard.shared.stores.sqlitefile`)."""

    WHAT = "the GPU history"
    SCHEMA = SCHEMA
    THREAD = "history"

    @classmethod
    async def open(
        cls, where: str | Path, *, raw_keep: float = DEFAULT_RAW_KEEP, keep: float = DEFAULT_KEEP
    ) -> Self:
        """The file at `where`, made when missing (`raw_keep`, `keep`: MongoDB's expiry; SQLite has none)."""
        return await super().open(where)

    async def add(self, points: list[GpuPoint]) -> None:
        if not points:
            return
        rows = [_row(p) for p in points]

        def write() -> None:
            with self.write_conn:
                self.write_conn.execute("BEGIN IMMEDIATE")
                self.write_conn.executemany(
                    f"INSERT OR IGNORE INTO gpu_points ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows
                )

        await self._on(self._writer, write)

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
        """One transaction: the raw points taken are deleted as their buckets are written."""
        cutoff = compact_cutoff(now, raw_keep, bucket)
        where = "bucket = 0 AND t < ?"
        args: list[object] = [cutoff]
        if node is not None:
            where += " AND (node = ? OR t < ?)"
            args += [node, cutoff - ORPHAN_AFTER]

        def work() -> Compacted:
            conn = self.write_conn
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                rows = conn.execute(
                    f"SELECT {COLUMNS} FROM gpu_points WHERE {where} ORDER BY t LIMIT ?", (*args, limit)
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
        tenant: str | None = None,
    ) -> list[GpuPoint]:
        where = ["t >= ?"]
        args: list[object] = [since]
        if until is not None:
            where.append("t < ?")
            args.append(until)
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if job_id is not None:
            where.append("instr(jobs, ?) > 0")
            args.append(f" {job_id} ")
        if tenant is not None:
            where.append("jobs != ''")  # (the tenant itself is judged on the holders below)
        sql = f"SELECT {COLUMNS} FROM gpu_points WHERE {' AND '.join(where)} ORDER BY t, node, gpu"

        def read() -> list[GpuPoint]:
            found = (_point(r) for r in self.read_conn.execute(sql, args).fetchall())
            return [p for p in found if holds_tenant(p, tenant)]

        return await self._on(self._reader, read)

    async def count(self) -> dict[float, int]:
        def read() -> dict[float, int]:
            rows = self.read_conn.execute("SELECT bucket, COUNT(*) FROM gpu_points GROUP BY bucket")
            return {b: n for b, n in rows.fetchall()}

        return await self._on(self._reader, read)
