"""Retention of the node's job directories (`<data dir>/jobs/<id>/`: the node's log files, pid files,
claims and the replicas' working directories, which are kept after the job for its outputs; and
`<job root>/<id>/`, the working directories of jobs that ran as other users), and of the jobs' storage folders
(`<storage root>/checkpoints/<tenant>/<id>/` and `<storage root>/outputs/<tenant>/<id>/`, docs/storage.md).

Worker 0 of each node sweeps every `retention_interval`: a job's directories are deleted once the event store
says the job is final (succeeded, failed, cancelled: it can neither run nor be requeued again) and ended more
than `retention` ago. A directory modified since the cut-off cannot belong to such a job and is passed by
without a read of the store; one of a job this executor still holds an attempt of, one the store does not
know, or one whose job is not final is never touched. Each sweep says what it freed (a line in the log, and
`gpuyard_retention_freed_bytes_total{what}`). The stores' own retention is the submit service's
(`services/submit/retention.py`).

A storage root on a filesystem that several nodes share is swept by each of them: the first to come deletes
a job's folders, the others find them gone.

The same sweep removes the node's job environments no job has used for `GPUYARD_ENVIRONMENT_RETENTION`
(`environments/node.py`), counted as `what="environments"` (docs/environments.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from gpuyard.services.executor.attempts import Attempts
from gpuyard.services.executor.environments.node import NodeEnvironments
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.paths import STORAGE_KINDS
from gpuyard.shared.stores.events import Projections

log = logging.getLogger(__name__)

NODE = "node"
ENVIRONMENTS = "environments"
"""What the node's own job directories are called in the counter (`what`), beside the storage kinds."""
FREED = "gpuyard_retention_freed_bytes"
"""The counter of what the sweeps deleted, in bytes (`_total` in the text format)."""


class JobDirSweeper:
    def __init__(
        self,
        data_dir: Path,
        store: Projections,
        attempts: Attempts,
        keep_seconds: float,
        job_root: Path | None = None,
        storage_root: Path | None = None,
        registry: CollectorRegistry | None = None,
        environments: NodeEnvironments | None = None,
    ):
        """`job_root`: where the working directories of jobs that run as other users are (the same job ids);
        `storage_root`: where the jobs' checkpoint and output folders are; `registry`: the service's Prometheus
        figures, which get the counter of bytes freed; `environments`: the node's job environments (the local
        backend's), those unused for their retention removed by the same sweep."""
        self.environments = environments
        self.jobs = Path(data_dir) / "jobs"
        self.job_root = Path(job_root) if job_root else None
        self.storage_root = Path(storage_root) if storage_root else None
        self.store = store
        self.attempts = attempts
        self.keep_seconds = keep_seconds
        self.freed: dict[str, int] = defaultdict(int)
        """Bytes deleted so far, by what (`node`, `checkpoints`, `outputs`)."""
        self.counter = (
            Counter(
                FREED,
                "Bytes the executor's retention deleted of finished jobs' directories: `what` is `node` (the "
                "node's log files and working directories), `checkpoints` or `outputs` (the storage root's); "
                "and of job environments unused for their retention: `environments`.",
                ["what"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    async def sweep(self, now: float | None = None) -> list[str]:
        """Delete the directories of the jobs ended more than `keep_seconds` ago; returns their job ids."""
        if self.keep_seconds <= 0:
            return []
        cut = (now or time.time()) - self.keep_seconds
        held = {record.key.job_id for record in self.attempts}
        deleted = []
        for job_id, folders in (await asyncio.to_thread(self._listing)).items():
            if max(modified for _, _, modified in folders) >= cut or job_id in held:
                continue
            if await self.expired(job_id, cut):
                if self.job_root is not None:
                    folders.append((NODE, self.job_root / job_id, 0.0))
                for what, path, _ in folders:
                    self.count(what, await asyncio.to_thread(delete, path))
                deleted.append(job_id)
        return deleted

    def count(self, what: str, freed: int) -> None:
        self.freed[what] += freed
        if self.counter is not None and freed:
            self.counter.labels(what=what).inc(freed)

    def _listing(self) -> dict[str, list[tuple[str, Path, float]]]:
        """The job directories of the node and of the storage root, by job id: (what, path, modified)."""
        found: dict[str, list[tuple[str, Path, float]]] = defaultdict(list)
        for job_id, path, modified in folders_in(self.jobs):
            found[job_id].append((NODE, path, modified))
        kinds = [self.storage_root / kind for kind in STORAGE_KINDS] if self.storage_root else []
        for kind, folder in zip(STORAGE_KINDS, kinds, strict=False):
            for _, tenant, _ in folders_in(folder):
                for job_id, path, modified in folders_in(tenant):
                    found[job_id].append((kind, path, modified))
        return found

    async def expired(self, job_id: str, cut: float) -> bool:
        doc = await self.store.get_projection(job_id)
        finished = doc.get("finished_at") if doc else None
        return finished is not None and datetime.fromisoformat(finished).timestamp() < cut

    async def sweep_environments(self) -> list[tuple[str, int]]:
        """Remove the node's job environments unused for their retention; (key, bytes freed) of each."""
        if self.environments is None:
            return []
        removed = await self.environments.sweep()
        for _key, freed in removed:
            self.count(ENVIRONMENTS, freed)
        return removed

    async def run(self, interval: float) -> None:
        envs = self.environments is not None and self.environments.settings.environment_retention > 0
        if self.keep_seconds <= 0 and not envs:
            return
        while True:
            try:
                before = dict(self.freed)
                removed = await self.sweep_environments()
                if removed:
                    freed = format_size(self.freed[ENVIRONMENTS] - before.get(ENVIRONMENTS, 0))
                    log.info("retention: removed %d unused job environment(s), freed %s", len(removed), freed)
                deleted = await self.sweep()
                if deleted:
                    log.info(
                        "retention: deleted the directories of %d finished job(s), %s",
                        len(deleted),
                        self.freed_text(before),
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "retention sweep of %s failed, tried again in %.0fs: %s", self.jobs, interval, exc
                )
            await asyncio.sleep(interval)

    def freed_text(self, before: dict[str, int]) -> str:
        """What the last sweep freed: 'freed 1.2 GiB (node 12 MiB, checkpoints 1.1 GiB, outputs 80 MiB)'."""
        parts = {what: self.freed[what] - before.get(what, 0) for what in (NODE, *STORAGE_KINDS)}
        each = ", ".join(f"{what} {format_size(n)}" for what, n in parts.items())
        return f"freed {format_size(sum(parts.values()))} ({each})"


def folders_in(parent: Path) -> list[tuple[str, Path, float]]:
    """The folders directly in `parent` (links not followed): (name, path, modified)."""
    try:
        entries = list(os.scandir(parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                out.append((entry.name, Path(entry.path), entry.stat(follow_symlinks=False).st_mtime))
        except OSError:
            continue
    return out


def delete(path: Path) -> int:
    """Delete the folder `path` (gone already: nothing); the bytes its files held."""
    freed = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                freed += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    shutil.rmtree(path, ignore_errors=True)
    return freed
