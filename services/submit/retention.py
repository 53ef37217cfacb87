"""Retention of what the platform keeps about finished jobs, in the stores: one place decides it.

Every `retention_interval` the submit service asks the event store for the jobs that ended more than
`retention` ago and are not compacted yet; for each, it deletes the job's shipped output from the log store,
and its kept outputs where an object store holds them (`GPUYARD_OUTPUT_STORE`; the executors remove the folders
of the storage root), then compacts its events (`EventStore.compact`: the first and last events and the projection are kept, so the
job still lists, describes and answers an idempotent submit), and finally gives the freed pages back
(`EventStore.reclaim`). Deleting logs first means a sweep stopped half way leaves at worst a compacted job
whose output is already gone, never output nobody will delete. Every step is idempotent: several submit
instances may sweep at once. The executors sweep their node's job directories (`services/executor/retention.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.stores.events import Retention
from gpuyard.shared.stores.logs import LogStore

log = logging.getLogger(__name__)
BATCH = 500


def cutoff(keep_seconds: float, now: float | None = None) -> str:
    """The end time (ISO 8601, as the store keeps it) before which a job's retention has run out."""
    return datetime.fromtimestamp((now or time.time()) - keep_seconds, UTC).isoformat()


async def sweep(
    store: Retention,
    logs: LogStore | None,
    keep_seconds: float,
    now: float | None = None,
    outputs: OutputStore | None = None,
) -> int:
    """Compact the jobs ended more than `keep_seconds` ago and delete their output (and their kept outputs,
    where an `OutputStore` holds them); returns how many jobs."""
    if keep_seconds <= 0:
        return 0
    before, seen = cutoff(keep_seconds, now), set()
    while True:
        expired = await store.expired(ended_before=before, limit=BATCH)
        new = [job_id for job_id in expired if job_id not in seen]
        for job_id in new:
            if logs is not None:
                await logs.delete_job(job_id)
            if outputs is not None:
                await asyncio.to_thread(outputs.remove_job, job_id)
            await store.compact(job_id)  # (one whose events still wait for the outbox: next sweep)
        seen.update(new)
        if len(expired) < BATCH or not new:
            break
    if seen:
        await store.reclaim()
    return len(seen)


async def run(
    store: Retention,
    logs: LogStore | None,
    keep_seconds: float,
    interval: float,
    outputs: OutputStore | None = None,
) -> None:
    """Sweep now, then every `interval` seconds; a failed sweep is logged and tried again next time."""
    if keep_seconds <= 0:
        log.info("retention: never (finished jobs' events and output are kept for good)")
        return
    while True:
        try:
            swept = await sweep(store, logs, keep_seconds, outputs=outputs)
            if swept:
                log.info("retention: compacted %d job(s) ended more than %.0fs ago", swept, keep_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("retention sweep failed, tried again in %.0fs: %s", interval, exc)
        await asyncio.sleep(interval)
