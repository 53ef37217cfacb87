"""A job's storage folders on the local backend: its checkpoints and its kept outputs
(`gpuyard.shared.runtime.paths.job_storage`: `<root>/checkpoints/<tenant>/<job id>/`, `<root>/outputs/…`).

Every attempt of a job finds the same two folders (a preemption, a retry, a requeue: docs/storage.md), 0700 and
owned by the user the job runs as (its tenant's on a root platform, `jobusers.py`; the platform's own
otherwise), in folders of the platform's that every user may pass through but not list (0711) where jobs run as
other users, 0700 where they run as the platform's own, and given to it as GPUYARD_CHECKPOINT_DIR and
GPUYARD_OUTPUT_DIR (`jobenv.py`). Each replica's first process makes them (`replicafolders.py`); the folders
above them, the same for every job of a tenant, the executor makes once (`StorageFolders`). They go with the
job's other data once its retention has run out (`retention.py`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpuyard.services.executor.replicafolders import STORAGE, Folder, users_folder
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.paths import JobStorage, job_storage, private_dir


def check_storage_reachable(root: Path) -> None:
    """Jobs that run as other users must reach their folders under the storage root: every folder above it (and
    the root itself, when it exists) searchable by all; a ValueError names the one that is not."""
    folder = Path(os.path.abspath(root))
    while not folder.exists():
        folder = folder.parent
    for step in (Path(os.path.realpath(folder)), *Path(os.path.realpath(folder)).parents):
        mode = os.stat(step).st_mode
        if not mode & 0o001:
            raise ValueError(
                f"storage_root: jobs run as other users cannot reach their checkpoints under {root}: {step} is "
                f"not searchable by other users (mode {oct(mode & 0o777)}); choose another GPUYARD_STORAGE_ROOT"
            )


class StorageFolders:
    """The storage folders of the jobs started here: the folders above them made once per tenant, by the
    executor; the job's own two listed for its replicas' first processes to make."""

    def __init__(self, root: Path):
        self.root = root
        self.made: set[str] = set()
        """The tenants whose folders of the storage root are made."""

    def for_job(self, tenant: str, job_id: str, user: JobUser | None) -> tuple[JobStorage, list[Folder]]:
        """The job's storage folders, and what its replica's first process makes of them. OSError when the
        folders above them cannot be made."""
        storage = job_storage(self.root, tenant, job_id)
        if tenant not in self.made:
            for folder in storage.folders():
                make_parent(os.path.dirname(folder), user)
            self.made.add(tenant)
        return storage, [users_folder(folder, user, STORAGE) for folder in storage.folders()]

    def forget(self) -> None:
        """The folders above may have gone (removed by hand): made again at the next start."""
        self.made.clear()


def make_parent(path: str, user: JobUser | None) -> None:
    """A folder of the storage root's above jobs' folders, with its missing parents: the platform's own, 0700,
    where jobs run as the platform's user (no one else passes, as the rest of its data dir); 0711 where they run
    as other users (they pass through, they do not list). One that exists is left as it is."""
    if user is None:
        private_dir(path)
        return
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o711)
            os.chmod(folder, 0o711)  # (whatever the umask)
