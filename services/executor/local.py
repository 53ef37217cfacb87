"""Local process backend: each replica is its own process group (a new session) in its own working directory,
with the job's environment, CPU and memory limits through cgroup v2 where the node allows it, and its output
piped through the executor into a size-capped, rotated log file.

Each replica's pid (and its start time, against pid reuse) is kept in `replica-<r>.pid` beside its log. A
restarted executor cannot wait for processes it did not start, so it reads those files, stops whatever of
the attempt still runs, and lets the attempt be recorded lost (the scheduler requeues it as a new attempt):
an attempt is never started twice, and never runs on unattended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from services.executor.backend import AttemptLaunch, Backend, BackendEvents
from services.executor.cgroups import Cgroups
from services.executor.child import Process, start_child
from services.executor.classify import classify_exit
from services.executor.exits import AttemptKey, replica_exit
from services.executor.jobenv import replica_env
from services.executor.logfile import LogPump, RotatingLog, tail_lines
from services.executor.pidfiles import make_replica_dirs, read_pid_files, write_pid_file
from services.executor.processes import (
    StartError,
    check_command,
    not_found,
    process_start_time,
    signal_group,
    stop_leftovers,
    terminate,
)
from shared.events import FailureReason, JobPlaced, JobReplicaExited
from shared.logstore import LogKey
from shared.logstore.shipper import LogShipper
from shared.paths import replica_files

log = logging.getLogger(__name__)


@dataclass
class LocalReplica:
    job_id: str
    attempt: int
    replica: int
    proc: Process
    log_path: str
    sink: RotatingLog
    pump: LogPump
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
    ):
        self.node = node
        self.shipper = shipper
        self.data_dir = data_dir
        self.cgroups = cgroups
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.simulated = simulated
        self.gpu_memory = gpu_memory or {}
        self.mps = mps
        self.replicas: dict[AttemptKey, dict[int, LocalReplica]] = {}
        self.events: BackendEvents | None = None
        self.watchers: set[asyncio.Task] = set()

    @property
    def limits(self) -> str:
        return self.cgroups.status.message

    async def open(self, events: BackendEvents) -> None:
        self.events = events
        await asyncio.to_thread(self.cgroups.setup)

    # ------------------------------------------------------------------ launch

    async def launch(self, launch: AttemptLaunch) -> JobReplicaExited | None:
        started: list[LocalReplica] = []
        for replica in launch.replicas:
            try:
                started.append(await self._start(launch, replica))
            except StartError as exc:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, exc.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                return replica_exit(
                    launch.job_id, launch.attempt, replica, self.node, reason=exc.reason, message=exc.message
                )
        self.replicas[launch.key] = {rep.replica: rep for rep in started}
        await self.events.replicas_started(launch.key, self.node, [rep.replica for rep in started])
        for rep in started:
            task = asyncio.create_task(self._watch(rep))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)
        return None

    async def _start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        """Start one replica. Whatever keeps it from starting is a StartError (a spec no rule caught, such as
        one with a NUL byte stored before the rule existed, must fail the job, not the executor), and leaves
        nothing behind: no descriptor, no log, no cgroup."""
        try:
            return await self._start_replica(launch, replica)
        except StartError:
            raise
        except Exception as exc:
            log.warning("job %s replica %d: cannot start", launch.job_id, replica, exc_info=True)
            raise StartError(FailureReason.START_FAILED, f"cannot start: {exc}") from None

    async def _start_replica(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
        placement = launch.placement(replica)
        spec = launch.spec
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
        )
        files = replica_files(self.data_dir, launch.job_id, launch.attempt, replica)
        if spec.working_dir:
            cwd = spec.working_dir
            if not os.path.isdir(cwd):
                raise StartError(FailureReason.START_FAILED, f"working directory {cwd!r} does not exist")
        else:
            cwd = files.work
            make_replica_dirs(files)
        argv = spec.argv
        cpus = placement.cpus or spec.resources.cpus
        memory = placement.memory_bytes or spec.resources.memory
        try:
            cgroup = self.cgroups.create(launch.job_id, launch.attempt, replica, cpus, memory)
        except OSError as exc:
            raise StartError(
                FailureReason.START_FAILED, f"cannot create its cgroup: {exc.strerror or exc}"
            ) from None
        with contextlib.ExitStack() as undo:  # what is made below is undone if the start fails
            undo.callback(Cgroups.remove, cgroup)
            if (
                cgroup is not None
            ):  # started through the cgroup's shell, a missing command is only an exit code
                check_command(argv[0], cwd, env.get("PATH"))
            sink = RotatingLog(
                files.log,
                self.log_max_bytes,
                self.log_backups,
                shipper=self.shipper,
                key=LogKey(launch.job_id, launch.attempt, replica),
            )
            undo.callback(sink.close)
            read_fd, write_fd = os.pipe()
            undo.callback(os.close, read_fd)
            try:
                proc = await start_child(Cgroups.wrap(argv, cgroup), cwd=cwd, env=env, output_fd=write_fd)
            except FileNotFoundError:
                raise StartError(FailureReason.COMMAND_NOT_FOUND, not_found(argv[0])) from None
            except PermissionError:
                raise StartError(
                    FailureReason.START_FAILED, f"permission denied: {argv[0]} is not executable"
                ) from None
            except OSError as exc:
                raise StartError(
                    FailureReason.START_FAILED, f"cannot start {argv[0]}: {exc.strerror or exc}"
                ) from None
            finally:
                os.close(write_fd)
            undo.callback(signal_group, proc.pid, signal.SIGKILL)
            write_pid_file(
                files.pid,
                {
                    "pid": proc.pid,
                    "start": process_start_time(proc.pid),
                    "node": self.node,
                    "cgroup": str(cgroup) if cgroup else None,
                },
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
        )

    async def _finish_io(self, rep: LocalReplica) -> None:
        """After the replica's first process ended: kill what is left of it, drain and close its log."""
        signal_group(rep.proc.pid, signal.SIGKILL)
        Cgroups.kill(rep.cgroup)
        with contextlib.suppress(TimeoutError):  # (a process that left the group may hold the pipe open)
            await asyncio.wait_for(asyncio.shield(rep.pump.done), 5)
        rep.pump.close()
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
        with contextlib.suppress(OSError):
            os.unlink(rep.pid_file)
        live = self.replicas.get(rep.key, {})
        live.pop(rep.replica, None)
        if not live:
            self.replicas.pop(rep.key, None)
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

    # ------------------------------------------------------------------ stop, adopt, close

    async def stop(self, key: AttemptKey, grace: float) -> None:
        reps = list(self.replicas.get(key, {}).values())
        await asyncio.gather(*(terminate(rep.proc, grace) for rep in reps))

    async def adopt(self, key: AttemptKey, replicas: dict[int, str]) -> bool:
        records = read_pid_files(self.data_dir, key[0], key[1], self.node)
        stopped = await stop_leftovers(records, grace=5)
        if stopped:
            log.warning(
                "job %s attempt %d: stopped %d replica(s) left running by the previous executor",
                key[0],
                key[1],
                stopped,
            )
        return False

    def started_before(self, key: AttemptKey) -> bool:
        """Whether an earlier executor started processes of this attempt here (its pid files remain)."""
        return bool(read_pid_files(self.data_dir, key[0], key[1], self.node))

    def sessions(self, key: AttemptKey) -> dict[int, int]:
        return {r: rep.proc.pid for r, rep in self.replicas.get(key, {}).items()}

    async def close(self, grace: float) -> None:
        for task in list(self.watchers):
            task.cancel()
        reps = [rep for reps in self.replicas.values() for rep in reps.values()]
        await asyncio.gather(*(terminate(rep.proc, grace) for rep in reps), return_exceptions=True)
        for rep in reps:
            rep.pump.close()
            rep.sink.close()
            Cgroups.remove(rep.cgroup)
