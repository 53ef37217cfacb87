"""What a replica of the local backend sees of the node's temporary folders and processes.

Where it runs as a tenant's user and the node allows mount namespaces, a mount namespace of its own, made by
its first process before it leaves root: /tmp and /var/tmp are its attempt's folder
`<job root>/<id>/attempt-<n>/tmp` (0700, its user's), /dev/shm its attempt's `/dev/shm/gpuyard-jobs/<id>-<n>`
(the same tmpfs as before), and /proc a proc of its own with hidepid=2 (Linux 5.8 on), which lists its user's
processes only. Otherwise (the platform not root, a job that runs as the platform's user, no namespaces on the
node, a working directory under /tmp) only its TMPDIR is private (a folder of its attempt's, 0700, its
user's). The replicas of one attempt on one node share those folders, which each replica's first process makes
(`replicafolders.py`); they are deleted when the last of them ends. The attempt's `job.started` says which
(`isolation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.jobenv import DEFAULT_MPS_PIPE_DIRECTORY
from gpuyard.services.executor.nodelog import node_log
from gpuyard.services.executor.processes import Namespaces, probe_namespaces, under
from gpuyard.services.executor.replicafolders import Folder, users_folder
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.paths import ReplicaFiles, job_workdir, replica_files

SHM = "/dev/shm"
SHM_JOBS = f"{SHM}/gpuyard-jobs"
"""The attempts' private /dev/shm folders: the platform's (0711), on the node's /dev/shm tmpfs."""
PRIVATE_FOLDERS = ("/tmp", "/var/tmp", SHM)
"""What a replica's mount namespace replaces with folders of its attempt's."""
NO_PRIVATE_TMP = (
    "jobs get a private TMPDIR only: /tmp, /var/tmp, /dev/shm and /proc are shared by every tenant's jobs on "
    "this node ({reason})"
)
PROC_SHARED = "jobs' /proc lists every process of the node, other tenants' command lines included ({reason})"
NOT_PRIVATE = "cannot give it a private /tmp and /proc: its reaper started it in the node's mount namespace"
NOT_MOUNTED = "cannot mount its volumes: its reaper started it in the node's mount namespace"
TMP = "its private temporary folders"


@dataclass(frozen=True)
class PrivateTmp:
    """How one replica is kept from the other tenants' temporary files and processes."""

    tmpdir: str
    """Its TMPDIR."""
    binds: tuple[tuple[str, str], ...] = ()
    """(folder, over) pairs of its mount namespace, in order; none: no namespace."""
    hide_pids: bool = False
    words: str = ""
    """The same, in the words of its `job.started` (`isolation`)."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables that go with it (CUDA_MPS_PIPE_DIRECTORY where MPS's pipes were under /tmp)."""
    folders: tuple[Folder, ...] = ()
    """Its folders, which its first process makes (in folders of its attempt's that are made before them)."""


class PrivateTmps:
    """The node's means of keeping replicas apart (`open`), and each attempt's private folders on it."""

    def __init__(self, data_dir: Path, job_root: Path, storage_root: Path | None = None):
        """`storage_root`: where jobs' checkpoint and output folders are, which a namespace must not hide."""
        self.data_dir = data_dir
        self.job_root = job_root
        self.storage_root = storage_root
        self.namespaces = Namespaces(False, False, "not tried yet")
        self.probed = False
        self.private_shm = False
        self.covered: tuple[str, ...] = ()
        self.hidden: str | None = None
        """A folder of PRIVATE_FOLDERS that the job root, the storage root or the platform's Python is in (its
        replicas would not find them in a namespace of their own)."""
        self.own_namespace: str | None = None
        self.isolations: dict[AttemptKey, str] = {}
        self.notes: dict[AttemptKey, tuple[str, ...]] = {}
        """What the node could not do for an attempt's replicas besides (`note`), for its `job.started`."""

    async def open(self, *, switches: bool) -> None:
        """Find what the node allows, where jobs run as other users (`switches`), and say what it lacks."""
        if switches:
            check_reachable(self.job_root)  # (refused before the start by the executor's preflight)
            private_dir_of_jobs(self.job_root)
            await self.probe()
            self.private_shm = self.namespaces.mounts and os.path.isdir(SHM) and shm_jobs_folder()
            self.covered = tuple(f for f in PRIVATE_FOLDERS[:2] if os.path.isdir(f))
            self.hidden = (
                under(self.job_root, PRIVATE_FOLDERS)
                or (under(self.storage_root, PRIVATE_FOLDERS) if self.storage_root else None)
                or under(Path(sys.executable).parent, PRIVATE_FOLDERS)
            )
            if self.namespaces.mounts and not self.private_shm:
                node_log.warning(f"{SHM_JOBS} cannot be the platform's own folder: jobs share /dev/shm")
        if switches and not self.namespaces.mounts:  # (without users, SHARED_RIGHTS said it)
            node_log.warning(NO_PRIVATE_TMP.format(reason=self.namespaces.reason))
        elif switches and not self.namespaces.hide_pids:
            node_log.warning(PROC_SHARED.format(reason=self.namespaces.reason))
        elif self.hidden:
            node_log.warning(
                NO_PRIVATE_TMP.format(
                    reason=f"the job root, the storage root or the platform's Python is under {self.hidden}"
                )
            )

    async def probe(self) -> Namespaces:
        """What mount namespaces the node allows (tried once: at the start where jobs run as other users, else
        at the first start that needs one, `volume_namespace`)."""
        if not self.probed:
            self.namespaces = await asyncio.to_thread(probe_namespaces)
            self.own_namespace = mount_namespace("self")
            self.probed = True
        return self.namespaces

    async def volume_namespace(self, private: PrivateTmp) -> str:
        """Why a replica cannot have a mount namespace of its own for its volumes ("" when it can: one for its
        private /tmp, or the platform is root on a node that allows them, whatever user the replica runs as:
        its volumes are all a namespace holds then, and a working directory under /tmp hides nothing)."""
        if private.binds:
            return ""
        found = await self.probe()
        return "" if found.mounts else found.reason

    def for_replica(
        self, key: AttemptKey, user: JobUser | None, working_dir: str | None, files: ReplicaFiles
    ) -> PrivateTmp:
        """The replica's private temporary folders (its attempt's on this node, made by its first process), and
        whether it gets a mount namespace of its own that puts them over the node's /tmp, /var/tmp and /dev/shm
        (not where that would hide its working directory, `working_dir` or under the job root, or the platform's
        Python)."""
        private = self._private_tmp(key, user, working_dir, files)
        self.isolations[key] = private.words
        return private

    def _private_tmp(
        self, key: AttemptKey, user: JobUser | None, working_dir: str | None, files: ReplicaFiles
    ) -> PrivateTmp:
        if user is None:
            folder = f"{files.attempt}/tmp"
            reason = "it runs as the platform's user" if os.geteuid() == 0 else "the platform is not root"
            made = (users_folder(folder, None, TMP),)
            return PrivateTmp(folder, words=f"private TMPDIR only: {reason}", folders=made)
        folder = f"{os.path.dirname(job_workdir(self.job_root, *key, 0))}/tmp"
        folders = [users_folder(folder, user, TMP)]
        hidden = self.hidden or (under(working_dir, PRIVATE_FOLDERS) if working_dir else None)
        if not self.namespaces.mounts or hidden:
            reason = (
                f"its working directory or the platform's Python is under {hidden}"
                if hidden
                else self.namespaces.reason
            )
            words = f"private TMPDIR only: {reason}"
            return PrivateTmp(folder, words=words, folders=tuple(folders))
        binds: list[tuple[str, str]] = []
        env: list[tuple[str, str]] = []
        pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY
        if under(pipes, PRIVATE_FOLDERS) and os.path.isdir(pipes):  # MPS's pipes, where its clients find them
            seen = (
                f"{os.path.dirname(folder)}/mps"  # (the platform's, in its attempt's: no job may replace it)
            )
            folders.append(Folder(seen, 0o711, None, TMP))
            binds.append((pipes, seen))
            env.append(("CUDA_MPS_PIPE_DIRECTORY", seen))
        binds += [(folder, over) for over in self.covered]
        if self.private_shm:
            shm = f"{SHM_JOBS}/{key.job_id}-{key.attempt}"
            folders.append(users_folder(shm, user, TMP))
            binds.append((shm, SHM))
        hide = self.namespaces.hide_pids
        words = "private /tmp, /var/tmp and /dev/shm" if self.private_shm else "private /tmp and /var/tmp"
        words += " (a mount namespace of its own); /proc lists "
        words += "its user's processes only" if hide else f"every process ({self.namespaces.reason})"
        return PrivateTmp("/tmp", tuple(binds), hide, words, tuple(env), tuple(folders))

    def in_node_namespace(self, pid: int) -> bool:
        """Whether a replica that was to get a mount namespace of its own runs in the executor's (`NOT_PRIVATE`,
        `NOT_MOUNTED`)."""
        return bool(self.own_namespace and mount_namespace(pid) == self.own_namespace)

    def isolation(self, key: AttemptKey) -> str:
        return self.isolations.get(key, "")

    def note(self, key: AttemptKey, notes: tuple[str, ...]) -> None:
        """What else the node could not do for the attempt's replicas (its volumes: `volumemounts.py`)."""
        if notes:
            self.notes[key] = tuple(dict.fromkeys((*self.notes.get(key, ()), *notes)))

    def notes_of(self, key: AttemptKey) -> list[str]:
        return list(self.notes.get(key, ()))

    def forget(self, key: AttemptKey) -> None:
        """The attempt's private folders on this node are deleted (its last replica here has ended)."""
        self.isolations.pop(key, None)
        self.notes.pop(key, None)
        folders = [
            f"{replica_files(self.data_dir, *key, 0).attempt}/tmp",
            f"{SHM_JOBS}/{key.job_id}-{key.attempt}",
        ]
        folders.append(f"{os.path.dirname(job_workdir(self.job_root, *key, 0))}/tmp")
        for folder in folders:  # (rmtree follows no link: one a job left in them leads nowhere)
            shutil.rmtree(folder, ignore_errors=True)


def mount_namespace(pid: int | str) -> str | None:
    """The mount namespace of a process (`self`: the executor's), None when it cannot be read (it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def shm_jobs_folder() -> bool:
    """`SHM_JOBS`, the platform's (root's, 0711, a folder, not a link), made if missing; False where it cannot
    be (another user's: attempts' private /dev/shm folders are not made in it)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(SHM_JOBS, 0o711)
    try:
        found = os.lstat(SHM_JOBS)
    except OSError:
        return False
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        return False
    if stat.S_IMODE(found.st_mode) != 0o711:
        os.chmod(SHM_JOBS, 0o711)
    return True


def private_dir_of_jobs(root: Path) -> None:
    """The job root: the platform's, searchable by all (0711), listable by none but the platform."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(root, 0o711)
    os.chmod(root, 0o711)


def check_reachable(root: Path) -> None:
    """Jobs that run as other users must reach their working directories under `root`: every folder above it
    searchable by all (a ValueError names the one that is not)."""
    folder = root.resolve()
    while not folder.exists():
        folder = folder.parent
    for step in (folder, *folder.parents):
        if not os.stat(step).st_mode & 0o001:
            raise ValueError(
                f"job_root: jobs run as other users cannot reach {root}: {step} is not searchable by "
                f"other users (mode {oct(os.stat(step).st_mode & 0o777)}); choose another GPUYARD_JOB_ROOT"
            )
