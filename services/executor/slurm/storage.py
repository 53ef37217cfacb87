"""What a batch job keeps and reads beyond its attempt on Slurm, as on the local backend (docs/storage.md,
docs/volumes.md): its job's checkpoint and output folders (GPUYARD_CHECKPOINT_DIR, GPUYARD_OUTPUT_DIR), its
volumes at their paths in its working directory (and in GPUYARD_VOLUME_<NAME>), its outputs copied to the
output store once its attempt has ended.

The storage root must be a filesystem every compute node sees at the same path, as the spool folder is: the
executor makes the job's folders there itself (`jobstorage.py`'s layout and owners, `reaper/folders.py`'s rules:
one of another user's is refused), before `sbatch`, where the local backend has each replica's first process
make them. A batch job runs in its compute node's own mount namespace, which GPUYARD does not enter: a volume is a
symbolic link to its folder, and read-only cannot be enforced (said in the attempt's `job.started`, in the local
backend's words, `volumemounts.READ_ONLY_NOT_ENFORCED`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from gpuyard.services.executor.classify import node_fault
from gpuyard.services.executor.exits import NodeFault
from gpuyard.services.executor.jobstorage import StorageFolders
from gpuyard.services.executor.local import publisher_of
from gpuyard.services.executor.reaper.folders import make_folders
from gpuyard.services.executor.replicafolders import STORAGE, Folder, refused_words
from gpuyard.services.executor.volumecache import CacheError, VolumeCache
from gpuyard.services.executor.volumemounts import MountError, Mounts, make_mount_points, plan
from gpuyard.shared.contracts.jobspec import VolumeMount
from gpuyard.shared.runtime.jobusers import JobUser, JobUsers
from gpuyard.shared.runtime.paths import JobStorage

NO_NAMESPACE = "a Slurm batch job runs in its compute node's own mount namespace"
"""Why a batch job's volume is a link (`volumemounts.plan`'s `why_none`)."""


class StorageRefused(Exception):
    """The replica cannot be given its folders or volumes, for the job's reason (the message): it does not
    start."""


@dataclass(frozen=True)
class ReplicaStorage:
    """What one replica is given: its job's folders, its volumes' links and variables, and the notes of what
    could not be done for it (read-only volumes)."""

    storage: JobStorage
    mounts: Mounts = field(default_factory=Mounts)


class SlurmStorage:
    """The jobs' folders under `root` (the storage root, shared by every compute node); `volume_store`,
    `output_store`: the object stores of volumes and of kept outputs (empty: folders of the storage root)."""

    def __init__(self, root: Path, users: JobUsers, *, volume_store: str = "", output_store: str = ""):
        self.root = root
        self.folders = StorageFolders(root)
        self.volume_cache = VolumeCache(volume_store, root, users.for_tenant) if volume_store else None
        self.outputs = publisher_of(output_store, root, users)

    async def prepare(
        self,
        *,
        tenant: str,
        job_id: str,
        replica: int,
        volumes: list[VolumeMount],
        cwd: str,
        user: JobUser | None,
    ) -> ReplicaStorage:
        """The replica's job folders made (kept as they are when an earlier attempt made them) and its volumes'
        links in `cwd`, off the event loop. StorageRefused for the job's reason; NodeFault for the storage's
        (its disk full)."""
        try:
            storage, folders = self.folders.for_job(tenant, job_id, user)
        except OSError as exc:
            raise self._refused(replica, exc, []) from None
        try:
            await asyncio.to_thread(make_folders, [folder.request() for folder in folders])
        except OSError as exc:
            raise self._refused(replica, exc, folders) from None
        if not volumes:
            return ReplicaStorage(storage)
        try:
            cached = await self.volume_cache.fetch(volumes, tenant) if self.volume_cache is not None else None
            mounts = plan(
                volumes, root=str(self.root), tenant=tenant, cwd=cwd, namespace=False, why_none=NO_NAMESPACE,
                cached=cached,
            )  # fmt: skip
            await asyncio.to_thread(make_mount_points, mounts, cwd, user)
        except (CacheError, MountError) as exc:
            raise StorageRefused(str(exc)) from None
        return ReplicaStorage(storage, mounts)

    def _refused(self, replica: int, exc: OSError, folders: list[Folder]) -> Exception:
        """Why the job's folders could not be made: the storage's fault (NodeFault), or the job's."""
        self.folders.forget()  # (one above them may have been removed: made again at the next start)
        if (why := node_fault(exc)) is not None:
            return NodeFault(replica, f"cannot make {STORAGE} in the storage root: {why}")
        return StorageRefused(refused_words(folders, exc.errno, exc.strerror or str(exc)))

    async def publish(self, tenant: str, job_id: str) -> str | None:
        """The job's outputs copied to the output store (what changed): the line that says so, for its log;
        None without an output store."""
        if self.outputs is None or not tenant:
            return None
        return await self.outputs.publish(tenant, job_id)
