"""Retention of the node's job directories (`<data dir>/jobs/<id>/`: the node's log files, pid files,
claims and the replicas' working directories, which are kept after the job for its outputs; and
`<job root>/<id>/`, the working directories of jobs that ran as other users).

Worker 0 of each node sweeps every `retention_interval`: a job's directory is deleted once the event store
says the job is final (succeeded, failed, cancelled: it can neither run nor be requeued again) and ended more
than `retention` ago. A directory modified since the cut-off cannot belong to such a job and is passed by
without a read of the store; one of a job this executor still holds an attempt of, one the store does not
know, or one whose job is not final is never touched. The stores' own retention is the submit service's
(`services/submit/retention.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

from gpuyard.services.executor.attempts import Attempts
from gpuyard.shared.stores.events import Projections

log = logging.getLogger(__name__)


class JobDirSweeper:
    def __init__(
        self,
        data_dir: Path,
        store: Projections,
        attempts: Attempts,
        keep_seconds: float,
        job_root: Path | None = None,
    ):
        """`job_root`: where the working directories of jobs that run as other users are (the same job ids)."""
        self.jobs = Path(data_dir) / "jobs"
        self.job_root = Path(job_root) if job_root else None
        self.store = store
        self.attempts = attempts
        self.keep_seconds = keep_seconds

    async def sweep(self, now: float | None = None) -> list[str]:
        """Delete the directories of the jobs ended more than `keep_seconds` ago; returns their job ids."""
        if self.keep_seconds <= 0:
            return []
        cut = (now or time.time()) - self.keep_seconds
        held = {record.key.job_id for record in self.attempts}
        deleted = []
        for job_id, modified in await asyncio.to_thread(self._listing):
            if modified >= cut or job_id in held:
                continue
            if await self.expired(job_id, cut):
                await asyncio.to_thread(shutil.rmtree, self.jobs / job_id, True)
                if self.job_root is not None:
                    await asyncio.to_thread(shutil.rmtree, self.job_root / job_id, True)
                deleted.append(job_id)
        return deleted

    def _listing(self) -> list[tuple[str, float]]:
        try:
            entries = list(os.scandir(self.jobs))
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    out.append((entry.name, entry.stat(follow_symlinks=False).st_mtime))
            except OSError:
                continue
        return out

    async def expired(self, job_id: str, cut: float) -> bool:
        doc = await self.store.get_projection(job_id)
        finished = doc.get("finished_at") if doc else None
        return finished is not None and datetime.fromisoformat(finished).timestamp() < cut

    async def run(self, interval: float) -> None:
        if self.keep_seconds <= 0:
            return
        while True:
            try:
                deleted = await self.sweep()
                if deleted:
                    log.info("retention: deleted the directories of %d finished job(s)", len(deleted))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "retention sweep of %s failed, tried again in %.0fs: %s", self.jobs, interval, exc
                )
            await asyncio.sleep(interval)
