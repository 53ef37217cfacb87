"""Local process backend: each replica is its own process group (a new session) in its own working directory,
with the job's environment, CPU and memory limits through cgroup v2 where the node allows it, and its output
piped through the executor into a size-capped, rotated log file.

Replicas are started by the executor's reaper (`reaper.py`), their parent, which outlives the executor: it
writes each replica's pid file (pid and start time, against pid reuse) and, when the replica ends, its exit
file, whether or not an executor still runs. A restarted executor (`adopt`) reports the exits written
meanwhile and watches the replicas still running until they end: an executor's restart never stops a job,
and never runs one twice. Only a replica gone without an exit record (its reaper killed too) makes the
attempt lost (the scheduler requeues it as a new attempt).

What a replica sees of the node's temporary folders and processes (`private_tmp`): where it runs as a tenant's
user and the node allows mount namespaces, a mount namespace of its own, made by its first process before it
leaves root: /tmp and /var/tmp are its attempt's folder `<job root>/<id>/attempt-<n>/tmp` (0700, its user's),
/dev/shm its attempt's `/dev/shm/gpuyard-jobs/<id>-<n>` (the same tmpfs as before), and /proc a proc of its
own with hidepid=2 (Linux 5.8 on), which lists its user's processes only. Otherwise (the platform not root, a
job that runs as the platform's user, no namespaces on the node, a working directory under /tmp) only its
TMPDIR is private (a folder of its attempt's, 0700, its user's). The replicas of one attempt on one node share
those folders; they are deleted when the last of them ends. The attempt's `job.started` says which
(`isolation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.backend import AttemptLaunch, Backend, BackendEvents
from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.classify import classify_exit, node_fault
from gpuyard.services.executor.exits import AttemptKey, NodeFault, replica_exit
from gpuyard.services.executor.jobenv import DEFAULT_MPS_PIPE_DIRECTORY, replica_env
from gpuyard.services.executor.jobusers import SHARED_RIGHTS, JobUser, JobUsers, platform_user, uid_key
from gpuyard.services.executor.logfile import LogBudget, LogPump, RotatingLog, output_after, tail_lines
from gpuyard.services.executor.nodelog import node_log
from gpuyard.services.executor.pidfiles import PidRecord, make_job_workdir, make_replica_dirs, read_pid_files
from gpuyard.services.executor.processes import (
    Namespaces,
    StartError,
    not_found,
    probe_namespaces,
    process_start_time,
    signal_group,
    stop_leftovers,
    terminate,
    under,
)
from gpuyard.services.executor.reaper_client import (
    ReapedProcess,
    ReaperClient,
    StartRefused,
    read_exit_file,
    watch_adopted,
)
from gpuyard.services.executor.start_helper import start_helper
from gpuyard.shared.contracts.events.jobs import FailureReason, JobPlaced, JobReplicaExited
from gpuyard.shared.runtime.paths import (
    PLATFORM_PYTHON_CLOSED,
    ReplicaFiles,
    job_workdir,
    private_dir,
    replica_files,
    unreachable_to_others,
)
from gpuyard.shared.stores.logs import LogKey
from gpuyard.shared.stores.logs.shipper import LogShipper

log = logging.getLogger(__name__)
LOST_MESSAGE = "its exit status was lost: its reaper ended before the replica"
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


class LocalBackend(Backend):
    name = "local"

    def __init__(
        self,
        *,
        node: str,
        data_dir: Path,
        cgroups: Cgroups,
        log_max_bytes: int,
        log_backups: int,
        simulated: bool,
        gpu_memory: dict[int, int] | None = None,
        mps: bool = False,
        shipper: LogShipper | None = None,
        job_users: JobUsers | None = None,
        job_root: Path | None = None,
        start_helper: bool = True,
        log_budget: LogBudget | None = None,
    ):
        """`log_budget`: what the running replicas of each tenant may hold of this process's logs together
        (`LogBudget`; None: no limit)."""
        self.node = node
        self.job_users = job_users or JobUsers({"*": None}, derive_base=None)
        self.job_root = job_root
        self.shipper = shipper
        self.data_dir = data_dir
        self.cgroups = cgroups
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.log_budget = log_budget
        self.simulated = simulated
        self.gpu_memory = gpu_memory or {}
        self.mps = mps
        self.replicas: dict[AttemptKey, dict[int, LocalReplica]] = {}
        self.events: BackendEvents | None = None
        self.watchers: set[asyncio.Task] = set()
        self.reaper = ReaperClient()
        self.start_helper = start_helper
        self.namespaces = Namespaces(False, False, "not tried yet")
        self.private_shm = False
        self.covered: tuple[str, ...] = ()
        self.hidden: str | None = None
        """A folder of PRIVATE_FOLDERS that the job root or the platform's Python is in (its replicas would not
        find them in a namespace of their own)."""
        self.own_namespace: str | None = None
        self.isolations: dict[AttemptKey, str] = {}

    @property
    def limits(self) -> str:
        return self.cgroups.status.message

    async def open(self, events: BackendEvents) -> None:
        self.events = events
        if self.job_users.shared_rights:
            node_log.warning(SHARED_RIGHTS.format(user=platform_user()))
        if self.job_users.switches and (closed := unreachable_to_others(Path(sys.executable))) is not None:
            node_log.warning(PLATFORM_PYTHON_CLOSED.format(python=sys.executable, closed=closed))
        if self.job_users.derives:  # (a key file that cannot be used: SecretFileError, the executor stops)
            self.job_users.key, said = await asyncio.to_thread(uid_key, self.data_dir)
            if said:
                node_log.warning(said)
        if self.job_users.switches and self.job_root is not None:
            check_reachable(self.job_root)  # (refused before the start by the executor's preflight)
            private_dir_of_jobs(self.job_root)
            self.namespaces = await asyncio.to_thread(probe_namespaces)
            self.private_shm = self.namespaces.mounts and os.path.isdir(SHM) and shm_jobs_folder()
            self.covered = tuple(f for f in PRIVATE_FOLDERS[:2] if os.path.isdir(f))
            self.hidden = under(self.job_root, PRIVATE_FOLDERS) or under(
                Path(sys.executable).parent, PRIVATE_FOLDERS
            )
            self.own_namespace = mount_namespace("self")
            if self.namespaces.mounts and not self.private_shm:
                node_log.warning(f"{SHM_JOBS} cannot be the platform's own folder: jobs share /dev/shm")
        if self.job_users.switches and not self.namespaces.mounts:  # (without users, SHARED_RIGHTS said it)
            node_log.warning(NO_PRIVATE_TMP.format(reason=self.namespaces.reason))
        elif self.job_users.switches and not self.namespaces.hide_pids:
            node_log.warning(PROC_SHARED.format(reason=self.namespaces.reason))
        elif self.hidden:
            node_log.warning(
                NO_PRIVATE_TMP.format(reason=f"the job root or the platform's Python is under {self.hidden}")
            )
        await asyncio.to_thread(self.cgroups.setup)
        helper = await asyncio.to_thread(start_helper, self.data_dir / "bin") if self.start_helper else None
        self.reaper.open(helper)  # (after the set-up: it lives in the executor's leaf cgroup)

    async def run(self) -> None:
        await self.reaper.until_gone()

    # ------------------------------------------------------------------ launch

    async def launch(self, launch: AttemptLaunch) -> JobReplicaExited | None:
        """Start the attempt's replicas of this node: None once they all run, or how the first that could not
        start ended (the others are stopped). NodeFault (exits.py) when one could not start for the node's
        fault (its disk full): nothing of the attempt is left running, and the executor requeues it."""
        started: list[LocalReplica] = []
        for replica in launch.replicas:
            try:
                started.append(await self._start(launch, replica))
            except NodeFault as fault:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, fault.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                await asyncio.to_thread(self.forget_private_tmp, launch.key)
                raise
            except StartError as exc:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, exc.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                await asyncio.to_thread(self.forget_private_tmp, launch.key)
                return replica_exit(
                    launch.job_id, launch.attempt, replica, self.node, reason=exc.reason, message=exc.message
                )
        self.replicas[launch.key] = {rep.replica: rep for rep in started}
        await self.events.replicas_started(launch.key, self.node, [rep.replica for rep in started])
        for rep in started:
            self._follow(rep)
        return None

    def _follow(self, rep: LocalReplica) -> None:
        task = asyncio.create_task(self._watch(rep))
        self.watchers.add(task)
        task.add_done_callback(self.watchers.discard)

    async def _start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        """Start one replica. Whatever keeps it from starting is a StartError (a spec no rule caught, such as
        one with a NUL byte stored before the rule existed, must fail the job, not the executor), or a
        NodeFault when it is the node's fault (its disk full: its folders, its log, its pid file), and leaves
        nothing behind: no descriptor, no log, no cgroup."""
        try:
            return await self._start_replica(launch, replica)
        except (StartError, NodeFault):
            raise
        except Exception as exc:
            if (why := node_fault(exc)) is not None:
                raise self._fault(replica, why) from None
            log.warning("job %s replica %d: cannot start", launch.job_id, replica, exc_info=True)
            raise StartError(FailureReason.START_FAILED, f"cannot start: {exc}") from None

    async def _start_replica(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        placement = launch.placement(replica)
        spec = launch.spec
        files = replica_files(self.data_dir, launch.job_id, launch.attempt, replica)
        user = self.job_users.for_tenant(launch.tenant)
        make_replica_dirs(files, work=not spec.working_dir and user is None)
        if spec.working_dir:
            cwd = spec.working_dir
            if not os.path.isdir(cwd):
                raise StartError(FailureReason.START_FAILED, f"working directory {cwd!r} does not exist")
        elif user is not None:
            cwd = job_workdir(self.job_root, launch.job_id, launch.attempt, replica)
            make_job_workdir(cwd, user.uid, user.gid)
        else:
            cwd = files.work
        private = self.private_tmp(launch.key, user, spec.working_dir, files)
        env = replica_env(
            job_id=launch.job_id,
            job_name=launch.job_name,
            tenant=launch.tenant,
            spec=spec,
            placed=JobPlaced(job_id=launch.job_id, attempt=launch.attempt, placements=launch.placements),
            replica=placement,
            master_addr=launch.master_addr,
            master_port=launch.master_port,
            simulated=self.simulated,
            gpu_memory=self.gpu_memory,
            mps=self.mps,
            tmpdir=private.tmpdir,
        )
        env.update(private.env)
        self.isolations[launch.key] = private.words
        if user is not None:  # (its own home: the platform's is not its to read)
            env.update(HOME=str(cwd), USER=user.name, LOGNAME=user.name)
        argv = spec.argv
        cpus = placement.cpus or spec.resources.cpus
        memory = placement.memory_bytes or spec.resources.memory
        try:
            cgroup = self.cgroups.create(launch.job_id, launch.attempt, replica, cpus, memory)
        except OSError as exc:
            if (why := node_fault(exc)) is not None:
                raise self._fault(replica, why, "its cgroup") from None
            raise StartError(
                FailureReason.START_FAILED, f"cannot create its cgroup: {exc.strerror or exc}"
            ) from None
        with contextlib.ExitStack() as undo:  # what is made below is undone if the start fails
            undo.callback(Cgroups.remove, cgroup)
            sink = RotatingLog(
                files.log,
                self.log_max_bytes,
                self.log_backups,
                shipper=self.shipper,
                key=LogKey(launch.job_id, launch.attempt, replica),
                budget=self.log_budget,
                tenant=launch.tenant,
            )
            undo.callback(sink.close)
            read_fd, write_fd = os.pipe()
            undo.callback(os.close, read_fd)
            try:
                proc = await self.reaper.start(
                    argv,
                    cwd=str(cwd),
                    env=env,
                    output=(write_fd, read_fd),
                    pid_file=files.pid,
                    exit_file=files.exit,
                    log_file=files.log,
                    record={
                        "node": self.node,
                        "cgroup": str(cgroup) if cgroup else None,
                        "shell": isinstance(spec.command, str),
                        "memory": memory if cgroup else 0,
                        "tenant": launch.tenant,  # (whose log budget its output counts against, once adopted)
                    },
                    cgroup=str(cgroup) if cgroup else None,
                    user=(user.uid, user.gid) if user else None,
                    **({"binds": private.binds, "hide_pids": private.hide_pids} if private.binds else {}),
                )
            except StartRefused as exc:
                if (why := node_fault(exc)) is not None:
                    raise self._fault(replica, why, START_STEPS.get(exc.step, exc.step)) from None
                raise start_error(exc, argv[0], str(cwd)) from None
            finally:
                os.close(write_fd)
            undo.callback(signal_group, proc.pid, signal.SIGKILL)
            if private.binds and self.own_namespace and mount_namespace(proc.pid) == self.own_namespace:
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

    def _fault(self, replica: int, why: str, what: str = "") -> NodeFault:
        """The NodeFault of a replica that could not start for the node's fault (`why`), saying what it was
        making when the step is known (`what`), never a path."""
        where = f" ({what})" if what else ""
        return NodeFault(replica, f"node {self.node} could not start replica {replica}: {why}{where}")

    def private_tmp(
        self, key: AttemptKey, user: JobUser | None, working_dir: str | None, files: ReplicaFiles
    ) -> PrivateTmp:
        """The replica's private temporary folders (its attempt's on this node, made here), and whether it gets
        a mount namespace of its own that puts them over the node's /tmp, /var/tmp and /dev/shm (not where that
        would hide its working directory, `working_dir` or under the job root, or the platform's Python)."""
        if user is None:
            folder = f"{files.attempt}/tmp"
            private_dir(folder)
            reason = "it runs as the platform's user" if os.geteuid() == 0 else "the platform is not root"
            return PrivateTmp(folder, words=f"private TMPDIR only: {reason}")
        folder = f"{os.path.dirname(job_workdir(self.job_root, *key, 0))}/tmp"
        make_job_workdir(folder, user.uid, user.gid)
        hidden = self.hidden or (under(working_dir, PRIVATE_FOLDERS) if working_dir else None)
        if not self.namespaces.mounts or hidden:
            reason = (
                f"its working directory or the platform's Python is under {hidden}"
                if hidden
                else self.namespaces.reason
            )
            return PrivateTmp(folder, words=f"private TMPDIR only: {reason}")
        binds: list[tuple[str, str]] = []
        env: list[tuple[str, str]] = []
        pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY
        if under(pipes, PRIVATE_FOLDERS) and os.path.isdir(pipes):  # MPS's pipes, where its clients find them
            seen = f"{os.path.dirname(folder)}/mps"
            with contextlib.suppress(FileExistsError):
                os.mkdir(seen, 0o711)  # (in the attempt's folder of the platform's: no job may replace it)
            binds.append((pipes, seen))
            env.append(("CUDA_MPS_PIPE_DIRECTORY", seen))
        binds += [(folder, over) for over in self.covered]
        if self.private_shm:
            shm = f"{SHM_JOBS}/{key.job_id}-{key.attempt}"
            make_job_workdir(shm, user.uid, user.gid)
            binds.append((shm, SHM))
        hide = self.namespaces.hide_pids
        words = "private /tmp, /var/tmp and /dev/shm" if self.private_shm else "private /tmp and /var/tmp"
        words += " (a mount namespace of its own); /proc lists "
        words += "its user's processes only" if hide else f"every process ({self.namespaces.reason})"
        return PrivateTmp("/tmp", tuple(binds), hide, words, tuple(env))

    def forget_private_tmp(self, key: AttemptKey) -> None:
        """The attempt's private folders on this node are deleted (its last replica here has ended)."""
        self.isolations.pop(key, None)
        folders = [
            f"{replica_files(self.data_dir, *key, 0).attempt}/tmp",
            f"{SHM_JOBS}/{key.job_id}-{key.attempt}",
        ]
        if self.job_root is not None:
            folders.append(f"{os.path.dirname(job_workdir(self.job_root, *key, 0))}/tmp")
        for folder in folders:  # (rmtree follows no link: one a job left in them leads nowhere)
            shutil.rmtree(folder, ignore_errors=True)

    def isolation(self, key: AttemptKey) -> str:
        return self.isolations.get(key, "")

    async def _finish_io(self, rep: LocalReplica) -> None:
        """After the replica's first process ended: kill what is left of it, drain and close its log."""
        signal_group(rep.proc.pid, signal.SIGKILL)
        Cgroups.kill(rep.cgroup)
        if rep.pump is not None:
            with contextlib.suppress(TimeoutError):  # (a process that left the group may hold the pipe open)
                await asyncio.wait_for(asyncio.shield(rep.pump.done), 5)
            rep.pump.close()
        if rep.sink is not None:
            rep.sink.close()

    async def _discard(self, rep: LocalReplica) -> None:
        await terminate(rep.proc, 2)
        await self._finish_io(rep)
        Cgroups.remove(rep.cgroup)
        with contextlib.suppress(OSError):
            os.unlink(rep.pid_file)

    async def _watch(self, rep: LocalReplica) -> None:
        returncode = await rep.proc.wait()
        await self._finish_io(rep)
        await self._shipped()  # its output is in the log store before its end is: `logs -f` misses nothing
        if returncode is None:
            reason, exit_code, sig, message, tail = FailureReason.NODE_LOST, None, None, LOST_MESSAGE, []
        else:
            tail = (
                await asyncio.to_thread(tail_lines, Path(rep.log_path)) if returncode else []
            )  # for a failure's cause
            reason, exit_code, sig, message = classify_exit(
                returncode,
                tail,
                shell=rep.shell,
                oom_killed=Cgroups.oom_killed(rep.cgroup),
                memory_bytes=rep.memory_bytes,
            )
        Cgroups.remove(rep.cgroup)
        live = self.replicas.get(rep.key, {})
        live.pop(rep.replica, None)
        if not live:
            self.replicas.pop(rep.key, None)
            await asyncio.to_thread(self.forget_private_tmp, rep.key)
        await self.events.replica_ended(
            replica_exit(
                job_id=rep.job_id,
                attempt=rep.attempt,
                replica=rep.replica,
                node=self.node,
                exit_code=exit_code,
                signal=sig,
                reason=reason,
                message=message,
                log_tail=tail,
            )
        )
        with contextlib.suppress(OSError):  # recorded: nothing of it is left to find after a restart
            os.unlink(rep.pid_file)

    # ------------------------------------------------------------------ stop, adopt, close

    async def stop(self, key: AttemptKey, grace: float) -> None:
        reps = list(self.replicas.get(key, {}).values())
        await asyncio.gather(*(terminate(rep.proc, grace) for rep in reps))

    async def adopt(self, key: AttemptKey, replicas: dict[int, str], *, unannounced: bool = False) -> bool:
        """Report the replicas that ended while no executor ran (their exit files), and watch those still
        running (their reaper alive, pid and start time unchanged). When one of them is gone without an exit
        record, nothing of the attempt is kept running: False (the attempt is lost)."""
        records = {rec.replica: rec for rec in read_pid_files(self.data_dir, key[0], key[1], self.node)}
        ended: dict[int, int] = {}
        running: dict[int, PidRecord] = {}
        for replica in replicas:
            status = read_exit_file(replica_files(self.data_dir, *key, replica).exit)
            if status is not None:
                ended[replica] = status
            elif (rec := records.get(replica)) is not None and still_running(rec):
                running[replica] = rec
            else:
                stopped = await stop_leftovers(list(records.values()), grace=5)
                log.warning(
                    "job %s attempt %d: replica %d is gone without an exit record; stopped %d replica(s)",
                    *key,
                    replica,
                    stopped,
                )
                for lost in sorted(replicas):  # what the node's files hold of their output is shipped
                    await self._ship_what_was_missed(key, lost, closed=True)
                await self._shipped()  # (before the attempt is recorded lost: `logs -f` misses nothing)
                await asyncio.to_thread(self.forget_private_tmp, key)
                return False
        if unannounced:  # (the event id its own executor would have given it: recorded once)
            await self.events.replicas_started(key, self.node, sorted(replicas))
        for replica in sorted(replicas):
            await self._ship_what_was_missed(key, replica, closed=replica in ended)
            rep = self._adopted(key, replica, records.get(replica), ended.get(replica))
            if replica in running:
                self.replicas.setdefault(key, {})[replica] = rep
            self._follow(rep)
        return True

    def _adopted(
        self, key: AttemptKey, replica: int, rec: PidRecord | None, status: int | None
    ) -> LocalReplica:
        """A replica started by an earlier executor: ended (`status`), or watched until it ends."""
        files = replica_files(self.data_dir, *key, replica)
        cgroup = Path(rec.cgroup) if rec and rec.cgroup else None
        proc = ReapedProcess(rec.pid if rec else 0, rec.start if rec else None)
        sink = pump = None
        if status is not None:
            proc.exited(status)
        else:
            pump, sink = self._reopen_output(rec, files, key, replica)
            task = asyncio.create_task(watch_adopted(rec.pid, rec.start, files.exit))
            self.watchers.add(task)
            task.add_done_callback(lambda t: proc.exited(None if t.cancelled() else t.result()))
        return LocalReplica(
            job_id=key.job_id,
            attempt=key.attempt,
            replica=replica,
            proc=proc,
            log_path=files.log,
            sink=sink,
            pump=pump,
            cgroup=cgroup,
            pid_file=files.pid,
            shell=rec.shell if rec else False,
            memory_bytes=rec.memory if rec else 0,
        )

    async def _shipped(self) -> None:
        """Send the output buffered so far (a store that is away keeps it for the shipper's next try)."""
        if self.shipper is None:
            return
        try:
            await self.shipper.flush()
        except Exception as exc:
            log.warning("the log store is away; the output is shipped later: %s", exc)

    async def _ship_what_was_missed(self, key: AttemptKey, replica: int, *, closed: bool) -> None:
        """Output the log store lacks (what the reaper wrote while no executor ran, what the last executor
        had not sent yet): shipped from the node's file."""
        if self.shipper is None:
            return
        log_key = LogKey(key.job_id, key.attempt, replica)
        path = Path(replica_files(self.data_dir, *key, replica).log)
        try:
            extent = await self.shipper.store.extent(log_key)
            begin, data = await asyncio.to_thread(
                output_after, path, extent.end if extent else 0, self.shipper.max_buffer
            )
        except Exception as exc:  # the store away: what the node's file holds stays there
            log.warning("job %s replica %d: cannot catch up its shipped output: %s", key[0], replica, exc)
            return
        self.shipper.open(log_key, begin)
        self.shipper.write(log_key, data)
        if closed:
            self.shipper.close(log_key)

    def _reopen_output(
        self, rec: PidRecord, files: ReplicaFiles, key: AttemptKey, replica: int
    ) -> tuple[LogPump | None, RotatingLog | None]:
        """The replica's output pipe, opened again through its reaper's descriptor, into its log (which goes
        on where it was)."""
        try:
            read_fd = os.open(f"/proc/{rec.reaper}/fd/{rec.fd}", os.O_RDONLY | os.O_NONBLOCK)
            fd = os.open(files.reader, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, str(os.getpid()).encode())  # its reaper leaves the rest of the output to us
            os.close(fd)
        except (OSError, TypeError) as exc:
            log.warning("job %s replica %d: its output cannot be read again: %s", key[0], replica, exc)
            return None, None
        sink = RotatingLog(
            files.log,
            self.log_max_bytes,
            self.log_backups,
            shipper=self.shipper,
            key=LogKey(key.job_id, key.attempt, replica),
            budget=self.log_budget if rec.tenant else None,  # (a pid file that does not say whose: none)
            tenant=rec.tenant,
        )
        return LogPump(read_fd, sink), sink

    def started_before(self, key: AttemptKey) -> bool:
        """Whether an earlier executor started processes of this attempt here (its pid files remain)."""
        return bool(read_pid_files(self.data_dir, key[0], key[1], self.node))

    def note(self, key: AttemptKey, line: str) -> None:
        data = f"\n{line}\n".encode()  # (a line of its own, even after a line the job left unfinished)
        for rep in self.replicas.get(key, {}).values():
            if rep.sink is None:
                continue
            try:
                rep.sink.write(data)
            except OSError as exc:  # a full disk: the job goes on
                log.warning("cannot write to the log of job %s replica %d: %s", rep.job_id, rep.replica, exc)

    def sessions(self, key: AttemptKey) -> dict[int, int]:
        return {r: rep.proc.pid for r, rep in self.replicas.get(key, {}).items()}

    async def close(self, grace: float, *, stop_jobs: bool = True) -> None:
        """The executor stops. With `stop_jobs` (a deliberate stop), every replica is stopped and forgotten
        (a restarted executor finds the attempt lost, and the scheduler requeues it); without, the replicas
        go on under their reaper, for the next executor to adopt."""
        for task in list(self.watchers):
            task.cancel()
        reps = [rep for reps in self.replicas.values() for rep in reps.values()]
        if stop_jobs:
            await asyncio.gather(*(terminate(rep.proc, grace) for rep in reps), return_exceptions=True)
        for rep in reps:
            if rep.pump is not None:
                rep.pump.close()
            if rep.sink is not None:
                rep.sink.close()
            if stop_jobs:
                Cgroups.kill(rep.cgroup)
                Cgroups.remove(rep.cgroup)
                files = replica_files(self.data_dir, rep.job_id, rep.attempt, rep.replica)
                for path in (files.exit, files.pid):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        if stop_jobs:
            for key in {rep.key for rep in reps}:
                self.forget_private_tmp(key)
        self.reaper.close()


def still_running(rec: PidRecord) -> bool:
    """The replica's first process still runs (or has ended and waits for its reaper), and its reaper too."""
    if rec.start is None or rec.reaper is None or process_start_time(rec.reaper) != rec.reaper_start:
        return False
    return process_start_time(rec.pid, zombie=True) == rec.start


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


START_STEPS = {"pid_file": "its pid file", "cwd": "its working directory", "cgroup": "its cgroup"}
"""What the reaper was doing at a step of a start (reaper.py), in words."""
NOT_PRIVATE = "cannot give it a private /tmp and /proc: its reaper started it in the node's mount namespace"


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
