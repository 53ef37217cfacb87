"""A job's storage folders on the local backend: its checkpoints and its kept outputs
(`gpuyard.shared.runtime.paths.job_storage`: `<root>/checkpoints/<tenant>/<job id>/`, `<root>/outputs/…`).

Every attempt of a job finds the same two folders (a preemption, a retry, a requeue: docs/storage.md); they are
made before each replica starts, 0700 and owned by the user the job runs as (its tenant's on a root platform,
`jobusers.py`; the platform's own otherwise), in folders of the platform's that every user may pass through but
not list (0711) where jobs run as other users, 0700 where they run as the platform's own, and given to it as
GPUYARD_CHECKPOINT_DIR and GPUYARD_OUTPUT_DIR (`jobenv.py`). They go with
the job's other data once its retention has run out (`retention.py`)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuyard.services.executor.jobusers import JobUser, JobUsers
from gpuyard.services.executor.pidfiles import make_job_workdir
from gpuyard.shared.runtime.paths import JobStorage, private_dir, storage_root
from gpuyard.shared.settings.executor import ExecutorSettings


def storage_root_of(settings: ExecutorSettings) -> Path:
    """The node's storage root, from the settings (`storage_root`, and where its default is: whether jobs run as
    other users). ValueError for job users that cannot be used (the executor's preflight says so first)."""
    switches = JobUsers.from_setting(settings.job_users, settings.job_uid_base).switches
    return storage_root(
        settings.storage_root, settings.data_dir, settings.job_root, jobs_switch_users=switches
    )


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


def make_job_storage(storage: JobStorage, user: JobUser | None) -> None:
    """The job's checkpoint and output folders, owned by `user` (None: the platform's own user, in folders of its
    own, 0700) and 0700; left as they are when an earlier attempt made them. PermissionError for one another user owns (never taken over); one
    the platform's user owns is a concurrent start's of the same job (another node, on a shared root), given to
    the job's user here as there."""
    if user is None:  # the platform's own, 0700 to the root as the rest of its data dir: no one else passes
        for folder in storage.folders():
            private_dir(folder)
        return
    uid, gid = user.uid, user.gid
    for folder in storage.folders():
        try:
            make_job_workdir(folder, uid, gid)
        except PermissionError:
            if os.stat(folder).st_uid != os.geteuid():
                raise
            os.chown(folder, uid, gid)
            os.chmod(folder, 0o700)
