"""The start of one replica of the local backend (`local.py`): its folders and working directory, its user,
its job's checkpoint and output folders (`jobstorage.py`), its environment, its private temporary folders (`privatetmp.py`), its cgroup, its log and output pipe, then
its process, which the executor's reaper starts (`reaper_client.py`).

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
from gpuyard.services.executor.exits import AttemptKey, NodeFault
from gpuyard.services.executor.jobenv import replica_env
from gpuyard.services.executor.jobstorage import make_job_storage
from gpuyard.services.executor.jobusers import JobUser, JobUsers
from gpuyard.services.executor.logfile import LogPump, RotatingLog
from gpuyard.services.executor.pidfiles import make_job_workdir, make_replica_dirs
from gpuyard.services.executor.privatetmp import NOT_PRIVATE, PrivateTmp, PrivateTmps
from gpuyard.services.executor.processes import StartError, not_found, signal_group
from gpuyard.services.executor.reaper_client import ReapedProcess, ReaperClient, StartRefused
from gpuyard.shared.contracts.events.jobs import FailureReason, JobPlaced
from gpuyard.shared.runtime.paths import JobStorage, ReplicaFiles, job_storage, job_workdir, replica_files
from gpuyard.shared.stores.logs import LogKey

log = logging.getLogger(__name__)

START_STEPS = {"pid_file": "its pid file", "cwd": "its working directory", "cgroup": "its cgroup"}
"""What the reaper was doing at a step of a start (`reaper/`), in words."""

OpenLog = Callable[[str, LogKey, str | None], RotatingLog]
"""The log file of a replica (its path, its key in the log store, its tenant): `LocalBackend.open_log`."""


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
    ):
        self.node = node
        self.data_dir = data_dir
        self.job_users = job_users
        self.job_root = job_root
        self.storage_root = storage_root
        self.cgroups = cgroups
        self.reaper = reaper
        self.private = private
        self.open_log = open_log
        self.simulated = simulated
        self.gpu_memory = gpu_memory
        self.mps = mps

    async def start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        """Start one replica. Whatever keeps it from starting is a StartError (a spec no rule caught, such as
        one with a NUL byte stored before the rule existed, must fail the job, not the executor), or a
        NodeFault when it is the node's fault (its disk full: its folders, its log, its pid file), and leaves
        nothing behind: no descriptor, no log, no cgroup."""
        try:
            return await self._start(launch, replica)
        except (StartError, NodeFault):
            raise
        except Exception as exc:
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
        make_replica_dirs(files, work=not spec.working_dir and user is None)
        cwd = self.working_dir(launch, replica, user, files)
        storage = self.job_storage(launch, replica, user)
        private = self.private.for_replica(launch.key, user, spec.working_dir, files)
        env = self.environment(launch, replica, private, user, cwd, storage)
        memory = placement.memory_bytes or spec.resources.memory
        cgroup = self.cgroup(launch, replica, placement.cpus or spec.resources.cpus, memory)
        with contextlib.ExitStack() as undo:  # what is made below is undone if the start fails
            undo.callback(Cgroups.remove, cgroup)
            sink = self.open_log(files.log, LogKey(launch.job_id, launch.attempt, replica), launch.tenant)
            undo.callback(sink.close)
            read_fd, write_fd = os.pipe()
            undo.callback(os.close, read_fd)
            try:
                proc = await self.spawn(
                    launch, replica, files, cwd, env, (write_fd, read_fd), cgroup, memory, user, private
                )
            finally:
                os.close(write_fd)
            undo.callback(signal_group, proc.pid, signal.SIGKILL)
            if self.private.in_node_namespace(private, proc.pid):
                raise StartError(FailureReason.START_FAILED, NOT_PRIVATE)
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
        )

    def working_dir(
        self, launch: AttemptLaunch, replica: int, user: JobUser | None, files: ReplicaFiles
    ) -> str:
        """The spec's working directory (which must exist), else one of the attempt's: under the job root,
        the job user's, when it runs as one; in the replica's folder otherwise."""
        if launch.spec.working_dir:
            cwd = launch.spec.working_dir
            if not os.path.isdir(cwd):
                raise StartError(FailureReason.START_FAILED, f"working directory {cwd!r} does not exist")
            return cwd
        if user is not None:
            cwd = job_workdir(self.job_root, launch.job_id, launch.attempt, replica)
            make_job_workdir(cwd, user.uid, user.gid)
            return cwd
        return files.work

    def job_storage(self, launch: AttemptLaunch, replica: int, user: JobUser | None) -> JobStorage:
        """The job's checkpoint and output folders, which every attempt of it shares, made if missing."""
        storage = job_storage(self.storage_root, launch.tenant, launch.job_id)
        try:
            make_job_storage(storage, user)
        except OSError as exc:
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why, "its checkpoint and output folders") from None
            raise StartError(
                FailureReason.START_FAILED,
                f"cannot make its checkpoint and output folders: {exc.strerror or exc}",
            ) from None
        return storage

    def environment(
        self,
        launch: AttemptLaunch,
        replica: int,
        private: PrivateTmp,
        user: JobUser | None,
        cwd: str,
        storage: JobStorage,
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
        cwd: str,
        env: dict[str, str],
        output: tuple[int, int],
        cgroup: Path | None,
        memory: int,
        user: JobUser | None,
        private: PrivateTmp,
    ) -> ReapedProcess:
        """The replica's first process, started by the reaper; what the reaper refused, in the executor's
        words (`start_error`), or a NodeFault."""
        argv = launch.spec.argv
        try:
            return await self.reaper.start(
                argv,
                cwd=str(cwd),
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
                binds=private.binds,  # (none: no namespace of its own)
                hide_pids=private.hide_pids and bool(private.binds),
            )
        except StartRefused as exc:
            if (why := node_fault(exc)) is not None:
                raise self.fault(replica, why, START_STEPS.get(exc.step, exc.step)) from None
            raise start_error(exc, argv[0], str(cwd)) from None


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
