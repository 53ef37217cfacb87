"""The start of one replica of the local backend (`local.py`): its user, its working directory, its job's
checkpoint and output folders (`jobstorage.py`), its private temporary folders (`privatetmp.py`), its volumes
(`volumemounts.py`), its environment, its cgroup, its log and output pipe, then its process, which the
executor's reaper starts (`reaper_client.py`), and whose first steps make its folders (`replicafolders.py`).

A start either gives a running replica (`LocalReplica`) or leaves nothing behind (no descriptor, no log, no
cgroup, no process) and says why: a `StartError` (the job's: a command not found, a working directory that
does not exist, and whatever else keeps it from starting) or a `NodeFault` (the node's: its disk full)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.backend import AttemptLaunch
from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.classify import node_fault
from gpuyard.services.executor.environments.builder import BuildFailed
from gpuyard.services.executor.environments.node import NodeEnvironments
from gpuyard.services.executor.exits import AttemptKey, NodeFault
from gpuyard.services.executor.jobenv import replica_env
from gpuyard.services.executor.jobstorage import StorageFolders
from gpuyard.services.executor.logfile import LogPump, RotatingLog
from gpuyard.services.executor.pidfiles import make_replica_dirs
from gpuyard.services.executor.privatetmp import NOT_MOUNTED, NOT_PRIVATE, PrivateTmp, PrivateTmps
from gpuyard.services.executor.processes import StartError, not_found, signal_group
from gpuyard.services.executor.reaper.folders import make_folders
from gpuyard.services.executor.reaper_client import ReapedProcess, ReaperClient, StartRefused
from gpuyard.services.executor.replicafolders import (
    STORAGE,
    WORKDIR,
    Folder,
    attempt_folders,
    refused_words,
    unmade,
    users_folder,
)
from gpuyard.services.executor.volumecache import CacheError, VolumeCache
from gpuyard.services.executor.volumemounts import MountError, Mounts, make_mount_points, plan
from gpuyard.shared.contracts.events.jobs import FailureReason, JobPlaced
from gpuyard.shared.runtime.jobusers import JobUser, JobUsers
from gpuyard.shared.runtime.paths import JobStorage, ReplicaFiles, job_workdir, replica_files
from gpuyard.shared.stores.logs import LogKey

log = logging.getLogger(__name__)

START_STEPS = {
    "pid_file": "its pid file",
    "cwd": "its working directory",
    "cgroup": "its cgroup",
    "folders": "its folders",
}
"""What the reaper was doing at a step of a start (`reaper/`), in words."""

OpenLog = Callable[[str, LogKey, str | None], RotatingLog]
"""The log file of a replica (its path, its key in the log store, its tenant): `LocalBackend.open_log`."""


@dataclass(frozen=True)
class Layout:
    """What a replica's first process finds around it: its working directory, the folders it makes (in order),
    its private temporary folders and its volumes."""

    cwd: str
    folders: list[Folder]
    private: PrivateTmp
    mounts: Mounts

    @property
    def binds(self) -> tuple[tuple[str, str], ...]:
        """What its mount namespace binds, in order (none: it has none)."""
        return self.private.binds + self.mounts.binds


@dataclass
class LocalReplica:
    job_id: str
    attempt: int
    replica: int
    proc: ReapedProcess
    log_path: str
    sink: RotatingLog | None
    pump: LogPump | None
    cgroup: Path | None
    pid_file: str
    shell: bool
    memory_bytes: int
    tenant: str = ""
    ended: bool = False
    """Its first process has ended (set before anything awaits: the last of an attempt's replicas to end here
    sees every other one ended)."""

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)


class ReplicaStarter:
    """Starts the local backend's replicas on this node (`start`)."""

    def __init__(
        self,
        *,
        node: str,
        data_dir: Path,
        job_users: JobUsers,
        job_root: Path,
        storage_root: Path,
        cgroups: Cgroups,
        reaper: ReaperClient,
        private: PrivateTmps,
        open_log: OpenLog,
        simulated: bool,
        gpu_memory: dict[int, int],
        mps: bool,
        volume_cache: VolumeCache | None = None,
        environments: NodeEnvironments | None = None,
    ):
        self.node = node
        self.data_dir = data_dir
        self.job_users = job_users
        self.job_root = job_root
        self.storage_root = storage_root
        self.storage = StorageFolders(storage_root)
        self.cgroups = cgroups
        self.reaper = reaper
        self.private = private
        self.open_log = open_log
        self.simulated = simulated
        self.gpu_memory = gpu_memory
        self.volume_cache = volume_cache
        """The node's copies of volumes in an object store; None: volumes are folders of the storage root."""
        self.mps = mps
        self.environments = environments
        """The node's job environments (`environment: {pip: [...]}`); None: jobs get the platform's Python."""

    async def start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        """Start one replica. Whatever keeps it from starting is a StartError (a spec no rule caught, such as
        one with a NUL byte stored before the rule existed, must fail the job, not the executor), or a
        NodeFault when it is the node's fault (its disk full: its folders, its log, its pid file), and leaves
        nothing behind: no descriptor, no log, no cgroup."""
        try:
            return await self._start(launch, replica)
        except (StartError, NodeFault):
            self.release_environment(launch, replica)
            raise
        except Exception as exc:
            self.release_environment(launch, replica)
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why) from None
            log.warning("job %s replica %d: cannot start", launch.job_id, replica, exc_info=True)
            raise StartError(FailureReason.START_FAILED, f"cannot start: {exc}") from None

    def fault(self, replica: int, why: str, what: str = "") -> NodeFault:
        """The NodeFault of a replica that could not start for the node's fault (`why`), saying what it was
        making when the step is known (`what`), never a path."""
        where = f" ({what})" if what else ""
        return NodeFault(replica, f"node {self.node} could not start replica {replica}: {why}{where}")

    async def _start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        placement = launch.placement(replica)
        spec = launch.spec
        files = replica_files(self.data_dir, launch.job_id, launch.attempt, replica)
        user = self.job_users.for_tenant(launch.tenant)
        make_replica_dirs(files, work=False)  # (its log's and pid file's: its first process makes the rest)
        venv, built_into = await self.job_environment(launch, replica, files)
        with contextlib.ExitStack() as undo:  # what is made below is undone if the start fails
            if built_into is not None:  # (the log its environment's build went to: the replica's own)
                undo.callback(built_into.close)
            layout, storage = await self.layout(launch, replica, user, files)
            env = self.environment(launch, replica, layout.private, user, layout.cwd, storage, venv)
            env.update(layout.mounts.env)
            memory = placement.memory_bytes or spec.resources.memory
            cgroup = self.cgroup(launch, replica, placement.cpus or spec.resources.cpus, memory)
            undo.callback(Cgroups.remove, cgroup)
            sink = built_into or self.open_log(files.log, LogKey(*launch.key, replica), launch.tenant)
            if built_into is None:
                undo.callback(sink.close)
            read_fd, write_fd = os.pipe()
            undo.callback(os.close, read_fd)
            try:
                proc = await self.spawn(
                    launch, replica, files, layout, env, (write_fd, read_fd), cgroup, memory, user
                )
            finally:
                os.close(write_fd)
            undo.callback(signal_group, proc.pid, signal.SIGKILL)
            if layout.binds and self.private.in_node_namespace(proc.pid):
                raise StartError(
                    FailureReason.START_FAILED, NOT_PRIVATE if layout.private.binds else NOT_MOUNTED
                )
            pump = LogPump(read_fd, sink)
            undo.pop_all()
        return LocalReplica(
            job_id=launch.job_id,
            attempt=launch.attempt,
            replica=replica,
            proc=proc,
            log_path=files.log,
            sink=sink,
            pump=pump,
            cgroup=cgroup,
            pid_file=files.pid,
            shell=isinstance(spec.command, str),
            memory_bytes=memory if cgroup else 0,
            tenant=launch.tenant,
        )

    async def layout(
        self, launch: AttemptLaunch, replica: int, user: JobUser | None, files: ReplicaFiles
    ) -> tuple[Layout, JobStorage]:
        """The replica's working directory, its folders, its private temporary folders and its volumes; its
        job's storage folders."""
        cwd, work = self.working_dir(launch, replica, user, files)
        storage, kept = self.job_storage(launch, replica, user)
        private = self.private.for_replica(launch.key, user, launch.spec.working_dir, files)
        above = attempt_folders(str(self.job_root), launch.key) if user is not None else []
        folders = [*above, *private.folders, *work, *kept]
        mounts = await self.volumes(launch, replica, user, cwd, private, folders)
        return Layout(cwd, folders, private, mounts), storage

    def working_dir(
        self, launch: AttemptLaunch, replica: int, user: JobUser | None, files: ReplicaFiles
    ) -> tuple[str, list[Folder]]:
        """The spec's working directory (which must exist), else one of the attempt's, which its first process
        makes: under the job root, the job user's, when it runs as one; in the replica's folder otherwise."""
        if launch.spec.working_dir:
            cwd = launch.spec.working_dir
            if not os.path.isdir(cwd):
                raise StartError(FailureReason.START_FAILED, f"working directory {cwd!r} does not exist")
            return cwd, []
        cwd = job_workdir(self.job_root, launch.job_id, launch.attempt, replica) if user else files.work
        return cwd, [users_folder(cwd, user, WORKDIR)]

    def job_storage(
        self, launch: AttemptLaunch, replica: int, user: JobUser | None
    ) -> tuple[JobStorage, list[Folder]]:
        """The job's checkpoint and output folders, which every attempt of it shares (its first process makes
        them if missing; the folders above them are made here, once per tenant)."""
        try:
            return self.storage.for_job(launch.tenant, launch.job_id, user)
        except OSError as exc:
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why, STORAGE) from None
            raise StartError(
                FailureReason.START_FAILED, f"cannot make {STORAGE}: {exc.strerror or exc}"
            ) from None

    async def volumes(
        self,
        launch: AttemptLaunch,
        replica: int,
        user: JobUser | None,
        cwd: str,
        private: PrivateTmp,
        folders: list[Folder],
    ) -> Mounts:
        """The replica's volumes (`volumemounts.py`): bound where it can get a mount namespace of its own (a
        root platform, on a node that allows them), links elsewhere (its job.started then says read-only is not
        enforced), at their places in its working directory, made here: its folders too, then, which its first
        process finds made."""
        if not launch.spec.volumes:
            return Mounts()
        why_none = await self.private.volume_namespace(private)
        cached = None
        if self.volume_cache is not None:
            try:
                cached = await self.volume_cache.fetch(launch.spec.volumes, launch.tenant)
            except CacheError as exc:
                raise StartError(FailureReason.START_FAILED, str(exc)) from None
        try:
            mounts = plan(
                launch.spec.volumes,
                root=str(self.storage_root),
                tenant=launch.tenant,
                cwd=cwd,
                namespace=not why_none,
                why_none=why_none,
                cached=cached,
            )
        except MountError as exc:
            raise StartError(FailureReason.START_FAILED, str(exc)) from None
        try:
            make_folders([folder.request() for folder in folders])
        except OSError as exc:
            raise self.folders_error(replica, folders, exc) from None
        try:
            make_mount_points(mounts, cwd, user)
        except MountError as exc:
            raise StartError(FailureReason.START_FAILED, str(exc)) from None
        self.private.note(launch.key, mounts.notes)
        return mounts

    async def job_environment(
        self, launch: AttemptLaunch, replica: int, files: ReplicaFiles
    ) -> tuple[str | None, RotatingLog | None]:
        """The job's own environment on this node, built now or reused, and the replica's log, open, with what
        the build said (the replica's output goes on in it); (None, None) for a job without one. One that cannot
        be built fails the job (`environment_failed`, with the builder's last lines), never retried."""
        wanted = launch.spec.environment
        if wanted is None:
            return None, None
        if not wanted.wants_build:
            raise StartError(
                FailureReason.START_FAILED,
                "the local backend runs no images: give the environment's packages (`pip`) instead of `image`",
            )
        if self.environments is None:
            raise StartError(FailureReason.ENVIRONMENT_FAILED, "this node builds no job environments")
        sink = self.open_log(files.log, LogKey(*launch.key, replica), launch.tenant)
        try:
            built = await self.environments.ensure(wanted, (launch.key, replica), sink.write)
        except BuildFailed as exc:
            sink.write(f"gpuyard: {exc.message}\n".encode())
            sink.close()
            raise StartError(FailureReason.ENVIRONMENT_FAILED, exc.text) from None
        except BaseException:
            sink.close()
            raise
        return str(built.path), sink

    def release_environment(self, launch: AttemptLaunch, replica: int) -> None:
        """The replica no longer uses its environment (it ended, or did not start)."""
        if self.environments is not None:
            self.environments.release((launch.key, replica))

    def folders_error(self, replica: int, folders: list[Folder], exc: OSError) -> StartError | NodeFault:
        """Why the replica's folders could not be made (by its first process, or here), naming which."""
        self.storage.forget()  # (one above them may have been removed: made again at the next start)
        if (why := node_fault(exc)) is not None:
            which = unmade(folders)
            return self.fault(replica, why, which.what if which else START_STEPS["folders"])
        message = exc.strerror or os.strerror(exc.errno or 0)
        return StartError(FailureReason.START_FAILED, refused_words(folders, exc.errno, message))

    def environment(
        self,
        launch: AttemptLaunch,
        replica: int,
        private: PrivateTmp,
        user: JobUser | None,
        cwd: str,
        storage: JobStorage,
        venv: str | None = None,
    ) -> dict[str, str]:
        env = replica_env(
            job_id=launch.job_id,
            job_name=launch.job_name,
            tenant=launch.tenant,
            spec=launch.spec,
            placed=JobPlaced(job_id=launch.job_id, attempt=launch.attempt, placements=launch.placements),
            replica=launch.placement(replica),
            master_addr=launch.master_addr,
            master_port=launch.master_port,
            simulated=self.simulated,
            gpu_memory=self.gpu_memory,
            mps=self.mps,
            tmpdir=private.tmpdir,
            storage=storage,
            venv=venv,
        )
        env.update(private.env)
        if user is not None:  # (its own home: the platform's is not its to read)
            env.update(HOME=str(cwd), USER=user.name, LOGNAME=user.name)
        return env

    def cgroup(self, launch: AttemptLaunch, replica: int, cpus: float, memory: int) -> Path | None:
        """The replica's cgroup, with its CPU and memory limits (None where the node has no cgroups)."""
        try:
            return self.cgroups.create(launch.job_id, launch.attempt, replica, cpus, memory)
        except OSError as exc:
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why, "its cgroup") from None
            raise StartError(
                FailureReason.START_FAILED, f"cannot create its cgroup: {exc.strerror or exc}"
            ) from None

    async def spawn(
        self,
        launch: AttemptLaunch,
        replica: int,
        files: ReplicaFiles,
        layout: Layout,
        env: dict[str, str],
        output: tuple[int, int],
        cgroup: Path | None,
        memory: int,
        user: JobUser | None,
    ) -> ReapedProcess:
        """The replica's first process, started by the reaper; what the reaper refused, in the executor's
        words (`start_error`), or a NodeFault."""
        argv = launch.spec.argv
        private, mounts = layout.private, layout.mounts
        try:
            return await self.reaper.start(
                argv,
                cwd=str(layout.cwd),
                env=env,
                output=output,
                pid_file=files.pid,
                exit_file=files.exit,
                log_file=files.log,
                record={
                    "node": self.node,
                    "cgroup": str(cgroup) if cgroup else None,
                    "shell": isinstance(launch.spec.command, str),
                    "memory": memory if cgroup else 0,
                    "tenant": launch.tenant,  # (whose log budget its output counts against, once adopted)
                },
                cgroup=str(cgroup) if cgroup else None,
                user=(user.uid, user.gid) if user else None,
                folders=[folder.request() for folder in layout.folders],
                binds=layout.binds,  # (none: no namespace of its own)
                read_only=mounts.read_only,
                hide_pids=private.hide_pids and bool(private.binds),
            )
        except StartRefused as exc:
            if exc.step == "folders":
                raise self.folders_error(replica, layout.folders, exc) from None
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why, START_STEPS.get(exc.step, exc.step)) from None
            raise start_error(exc, argv[0], str(layout.cwd)) from None


def start_error(refused: StartRefused, argv0: str, cwd: str) -> StartError:
    """Why a replica did not start, in the executor's words (the reaper says at which step)."""
    message = refused.strerror or os.strerror(refused.errno or 0)
    if refused.step == "exec" and refused.errno == errno.ENOENT:
        return StartError(FailureReason.COMMAND_NOT_FOUND, not_found(argv0))
    if refused.step == "exec" and refused.errno == errno.EACCES:
        return StartError(FailureReason.START_FAILED, f"permission denied: {argv0} is not executable")
    if refused.step == "cwd":
        return StartError(FailureReason.START_FAILED, f"cannot enter its working directory {cwd}: {message}")
    if refused.step == "cgroup":
        return StartError(
            FailureReason.START_FAILED, f"could not enter its cgroup (CPU and memory limits): {message}"
        )
    if refused.step == "user":
        return StartError(FailureReason.START_FAILED, f"cannot switch to the job's user: {message}")
    if refused.step == "namespace":
        return StartError(FailureReason.START_FAILED, f"cannot give it a private /tmp and /proc: {message}")
    return StartError(FailureReason.START_FAILED, f"cannot start: {message}")
