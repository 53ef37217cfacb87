"""Where things live in the data directory, and in the storage root (jobs' checkpoints and outputs); one
definition for the services that write and read them.

The executor starts hundreds of replicas a second and builds each one's paths as strings (`ReplicaFiles`):
a pathlib path costs it some 20 µs to make. Everyone else uses the Path forms below, made from the same.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ReplicaFiles:
    """One replica's files in one attempt's directory, as strings."""

    job: str
    """The job's directory, `<data dir>/jobs/<id>`."""
    attempt: str
    """The attempt's directory, `<job>/attempt-<n>`."""
    replica: int

    @property
    def log(self) -> str:
        """Combined stdout and stderr (rotated files beside it: `backup_path`)."""
        return f"{self.attempt}/replica-{self.replica}.log"

    @property
    def pid(self) -> str:
        """The replica's process id and start time, and its reaper's, for a restarted executor to find it."""
        return f"{self.attempt}/replica-{self.replica}.pid"

    @property
    def exit(self) -> str:
        """How the replica's first process ended (its status, written by its reaper), for whichever executor
        reports it."""
        return f"{self.attempt}/replica-{self.replica}.exit"

    @property
    def reader(self) -> str:
        """The pid of the executor that adopted the replica and reads its output (its reaper, which also holds
        the pipe, then leaves the output at the replica's end to that reader while it lives)."""
        return f"{self.attempt}/replica-{self.replica}.reader"

    @property
    def work(self) -> str:
        """Its working directory (unless the job names one), kept after the job for the retention
        (`GPUYARD_RETENTION`, then deleted with the job's directory: services/executor/retention.py)."""
        return f"{self.attempt}/work-{self.replica}"


def job_workdir(job_root: Path | str, job_id: str, attempt: int, replica: int) -> str:
    """The working directory of a replica that runs as another user than the platform's, outside the private
    data directory: `<job root>/<id>/attempt-<n>/work-<r>` (its folders 0711: searchable, not listable)."""
    return f"{job_root}/{job_id}/attempt-{attempt}/work-{replica}"


STORAGE = "storage"
"""The storage root's folder name in its default places (`storage_root`)."""
CHECKPOINTS = "checkpoints"
OUTPUTS = "outputs"
STORAGE_KINDS = (CHECKPOINTS, OUTPUTS)
VOLUMES = "volumes"
"""The per-job folders of the storage root, each `<root>/<kind>/<tenant>/<job id>/`."""


@dataclass(frozen=True, slots=True)
class JobStorage:
    """A job's folders that every attempt of it shares (its preemptions, retries and requeues): what it saves
    to resume from, and what it keeps (docs/storage.md)."""

    checkpoints: str
    """`<root>/checkpoints/<tenant>/<job id>`: GPUYARD_CHECKPOINT_DIR."""
    outputs: str
    """`<root>/outputs/<tenant>/<job id>`: GPUYARD_OUTPUT_DIR."""

    def folders(self) -> tuple[str, str]:
        return self.checkpoints, self.outputs


def job_storage(root: Path | str, tenant: str, job_id: str) -> JobStorage:
    """The storage folders of a job of `tenant` under the storage root."""
    return JobStorage(f"{root}/{CHECKPOINTS}/{tenant}/{job_id}", f"{root}/{OUTPUTS}/{tenant}/{job_id}")


def volume_dir(root: Path | str, tenant: str, name: str) -> Path:
    """The folder of `tenant`'s volume `name` under the storage root (docs/volumes.md)."""
    return Path(root) / VOLUMES / tenant / name


def storage_root(setting: Path | None, data_dir: Path, job_root: Path, *, jobs_switch_users: bool) -> Path:
    """The storage root: the setting (`GPUYARD_STORAGE_ROOT`), else `storage/` in the data dir, or, where jobs
    run as other users than the platform's (a root platform), `storage/` in the job root, which they can
    reach (the data dir is closed to them)."""
    if setting is not None:
        return Path(setting)
    return (job_root if jobs_switch_users else data_dir) / STORAGE


def replica_files(data_dir: Path | str, job_id: str, attempt: int, replica: int) -> ReplicaFiles:
    job = f"{data_dir}/jobs/{job_id}"
    return ReplicaFiles(job, f"{job}/attempt-{attempt}", replica)


def attempt_dir(data_dir: Path, job_id: str, attempt: int) -> Path:
    return Path(replica_files(data_dir, job_id, attempt, 0).attempt)


def log_path(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    """Combined stdout and stderr of one replica of one attempt."""
    return Path(replica_files(data_dir, job_id, attempt, replica).log)


def backup_path(path: Path, n: int) -> Path:
    """The n-th rotated file of a log (1 = the most recent one)."""
    return path.with_name(f"{path.name}.{n}")


def log_files(path: Path) -> list[Path]:
    """Every file of a log that exists, oldest first; the live file (`path`) last."""
    backups: list[tuple[int, Path]] = []
    prefix = path.name + "."
    if path.parent.is_dir():
        for entry in path.parent.iterdir():
            suffix = entry.name.removeprefix(prefix)
            if entry.name.startswith(prefix) and suffix.isdigit():
                backups.append((int(suffix), entry))
    files = [p for _, p in sorted(backups, reverse=True)]
    if path.exists():
        files.append(path)
    return files


PRIVATE_FILE = 0o600
"""The platform's files (stores, logs, pid files, tokens) are readable by its own user alone; its folders
0700. Its processes also run with umask 0o077 (`gpuyard.shared.runtime.service.run_service`, `gpuyard up`); its jobs do not."""


def private_dir(path: Path | str) -> None:
    """Make `path` and its missing parents 0700 (os.makedirs gives the parents the umask's mode); an existing
    folder is left as it is. The folder is made first and its parents only when it cannot be: one system call
    where its parents exist (the executor makes an attempt's folder for each job it starts)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent or parent == path:
            raise
        private_dir(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write `path` whole with mode 0600 from its first byte (a temporary file renamed over it), its folder
    0700: for secrets (bus credentials, the publish key)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")  # (PID 1 in two containers)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def private_file(path: Path, *companions: str) -> None:
    """Create `path` 0600 if missing, else take group and other permissions away from it and from its
    `companions` that exist (files named `path` + suffix: an SQLite file's -wal and -shm)."""
    private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
    for file in (path, *(path.with_name(path.name + suffix) for suffix in companions)):
        with contextlib.suppress(FileNotFoundError):
            if os.stat(file).st_mode & 0o077:
                os.chmod(file, PRIVATE_FILE)


def unreachable_to_others(path: Path) -> Path | None:
    """The first folder above `path` (links followed) that users other than its owner and group cannot search,
    or `path` itself when they cannot run it; None when a job of another user can run it."""
    target = Path(os.path.realpath(path))
    for step in reversed(target.parents):
        if not os.stat(step).st_mode & 0o001:
            return step
    return None if os.stat(target).st_mode & 0o001 else target


PLATFORM_PYTHON_CLOSED = (
    "jobs run as unprivileged users, who cannot run the platform's Python ({python}): {closed} is closed to "
    "other users. A job's `python`, `torchrun` or `gpuyard` from the platform's environment will fail with "
    "'permission denied'; install GPUYARD where other users can read it, or run jobs with the platform's "
    "rights (GPUYARD_JOB_USERS='*=platform', not isolated)"
)
