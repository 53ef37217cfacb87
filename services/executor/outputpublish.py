"""A job's kept outputs copied to the output store once an attempt's last replica on this node has ended
(`GPUYARD_OUTPUT_STORE`, `gpuyard.shared.runtime.outputstore`): what changed since the last copy, read as the
job's user's files (`SafeFolder`), from a thread. A copy that fails is said in the job's log and the node's, and
never fails the job: the folder stays in the storage root, and the next attempt's end copies it again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.paths import job_storage
from gpuyard.shared.runtime.safefolder import SafeFolder

log = logging.getLogger(__name__)


class OutputPublisher:
    """Copies jobs' output folders under `storage_root` to `store`; `owner_of(tenant)`: the user its jobs run as
    (None: the platform's), whose files alone are read."""

    def __init__(self, store: OutputStore, storage_root: Path, owner_of: Callable[[str], JobUser | None]):
        self.store = store
        self.storage_root = storage_root
        self.owner_of = owner_of

    async def publish(self, tenant: str, job_id: str) -> str:
        """Copy what changed; the line that says what was copied (or why not), for the job's log."""
        user = self.owner_of(tenant)
        folder = SafeFolder(
            job_storage(self.storage_root, tenant, job_id).outputs, user.uid if user else None
        )
        try:
            files, size = await asyncio.to_thread(self.store.publish, tenant, job_id, folder)
        except Exception as exc:  # (any store error: the job's outcome stands)
            log.warning("job %s: its outputs were not copied to the output store: %s", job_id, exc)
            return f"outputs: not copied to the output store ({exc}); kept on this node"
        if not files:
            return "outputs: nothing new to copy to the output store"
        return f"outputs: copied {files} file(s), {format_size(size)}, to the output store"
