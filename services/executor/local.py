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
import json
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from services.executor.backend import AttemptLaunch, Backend, BackendEvents, Key, ReplicaEnded, StartFailure
from services.executor.cgroups import ENTER_FAILED, Cgroups
from services.executor.child import Process, start_child
from services.executor.classify import classify_log_tail
from services.executor.jobenv import replica_env
from services.executor.logfile import RotatingLog, tail_lines
from shared.events import FailureReason, JobPlaced
from shared.paths import ReplicaFiles, attempt_dir, replica_files
from shared.units import format_size

log = logging.getLogger(__name__)
READ_CHUNK = 256 * 1024


class StartError(Exception):
    def __init__(self, reason: FailureReason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------------- processes


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def terminate(proc: Process, grace: float) -> None:
    """SIGTERM to the whole process group, SIGKILL after `grace` seconds."""
    if proc.returncode is not None:
        signal_group(proc.pid, signal.SIGKILL)  # leftovers of the group
        return
    signal_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
    except TimeoutError:
        signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
    signal_group(proc.pid, signal.SIGKILL)


def check_command(argv0: str, cwd: Path | str, path_env: str | None) -> None:
    """Refuse, with the reason, a command that cannot be executed (before anything is started). Needed only
    where the process starts through a wrapper: a plain start says the same through its OSError."""
    if "/" in argv0:
        target = Path(argv0) if os.path.isabs(argv0) else Path(cwd, argv0)
        if not target.exists():
            raise StartError(FailureReason.COMMAND_NOT_FOUND, not_found(argv0))
        if target.is_dir() or not os.access(target, os.X_OK):
            raise StartError(FailureReason.START_FAILED, f"permission denied: {argv0} is not executable")
    elif shutil.which(argv0, path=path_env or os.defpath) is None:
        raise StartError(FailureReason.COMMAND_NOT_FOUND, not_found(argv0))


def not_found(argv0: str) -> str:
    return f"command not found: {argv0}" + ("" if "/" in argv0 else " (not in the PATH)")


def classify_exit(
    returncode: int,
    tail: list[str],
    shell: bool,
    *,
    oom_killed: bool = False,
    memory_bytes: int = 0,
) -> tuple[FailureReason | None, int | None, int | None, str]:
    """(reason, exit_code, signal, message) for a replica's return code; reason None means success."""
    if returncode == 0:
        return None, 0, None, ""
    sig = -returncode if returncode < 0 else None
    code = returncode if returncode >= 0 else None
    if oom_killed:
        limit = f" ({format_size(memory_bytes)})" if memory_bytes else ""
        return FailureReason.OOM_KILLED, code, sig, f"killed for exceeding its memory limit{limit}"
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        if sig == signal.SIGKILL:
            return FailureReason.SIGNAL, None, sig, f"killed by {name} (out of memory, or killed by someone)"
        return FailureReason.SIGNAL, None, sig, f"killed by {name}"
    if returncode == 125 and any(ENTER_FAILED in line for line in tail):
        return (
            FailureReason.START_FAILED,
            returncode,
            None,
            "could not enter its cgroup (CPU and memory limits)",
        )
    if classify_log_tail(tail) == FailureReason.CUDA_OOM:
        return FailureReason.CUDA_OOM, returncode, None, "CUDA out of memory (seen in the log)"
    if shell and returncode == 127:
        return (
            FailureReason.COMMAND_NOT_FOUND,
            returncode,
            None,
            "command not found (exit code 127 from the shell)",
        )
    if returncode > 128 and returncode - 128 in signal.Signals._value2member_map_:
        name = signal.Signals(returncode - 128).name
        return (
            FailureReason.EXIT_CODE,
            returncode,
            None,
            f"exited with code {returncode} (a child got {name})",
        )
    return FailureReason.EXIT_CODE, returncode, None, f"exited with code {returncode}"


# ---------------------------------------------------------------------- pid files


def pid_file(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    return Path(replica_files(data_dir, job_id, attempt, replica).pid)


def write_pid_file(path: str, record: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(record).encode())
    finally:
        os.close(fd)


def make_replica_dirs(files: ReplicaFiles) -> None:
    """The job's, the attempt's and the replica's working directory: three mkdir calls where os.makedirs
    would also stat each parent (and pathlib would make a path of each)."""
    try:
        for folder in (files.job, files.attempt, files.work):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
    except FileNotFoundError:  # no jobs/ folder yet
        os.makedirs(files.work, exist_ok=True)


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096).decode()
        finally:
            os.close(fd)
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None  # a zombie: it has ended
    return int(fields[19])


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (scans /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry.name))
    return members


@dataclass(frozen=True)
class PidRecord:
    path: Path
    pid: int
    start: int | None
    node: str
    cgroup: str | None


def read_pid_files(data_dir: Path, job_id: str, attempt: int, node: str) -> list[PidRecord]:
    records = []
    folder = attempt_dir(data_dir, job_id, attempt)
    for path in sorted(folder.glob("replica-*.pid")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("node") == node:
            records.append(PidRecord(path, int(doc["pid"]), doc.get("start"), node, doc.get("cgroup")))
    return records


async def stop_leftovers(records: list[PidRecord], grace: float) -> int:
    """Stop what still runs of processes started by an earlier executor; how many groups were running."""
    running = 0
    for rec in records:
        alive = rec.start is not None and process_start_time(rec.pid) == rec.start
        members = [rec.pid] if alive else session_members(rec.pid)
        if members:
            running += 1
            signal_group(rec.pid, signal.SIGTERM)
            for _ in range(max(1, int(grace * 10))):
                if not session_members(rec.pid):
                    break
                await asyncio.sleep(0.1)
            signal_group(rec.pid, signal.SIGKILL)
            for pid in session_members(rec.pid):  # anything that left the group but not the session
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if rec.cgroup:
            Cgroups.kill(Path(rec.cgroup))
            Cgroups.remove(Path(rec.cgroup))
        with contextlib.suppress(OSError):
            rec.path.unlink()
    return running


# ---------------------------------------------------------------------- the backend


class _LogPump:
    """Copies a replica's output pipe into its rotating log file.

    The pipe's read end is a plain reader of the event loop, closed right after it is unregistered (a pipe
    transport of uvloop closes its descriptor first and leaves it registered until a later turn of the loop:
    a new pipe given that number meanwhile could not be watched)."""

    def __init__(self, fd: int, sink: RotatingLog):
        self.fd = fd
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("cannot read the output of %s: %s", self.sink.path, exc)
            data = b""
        if not data:  # every writer has closed it: the replica and whatever it started are gone
            self.close()
            return
        try:
            self.sink.write(data)
        except OSError as exc:  # a full disk must not take the executor down; the job goes on
            log.warning("cannot write log %s: %s", self.sink.path, exc)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)


@dataclass
class LocalReplica:
    job_id: str
    attempt: int
    replica: int
    proc: Process
    log_path: str
    sink: RotatingLog
    pump: _LogPump
    cgroup: Path | None
    pid_file: str
    shell: bool
    memory_bytes: int

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt)


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
    ):
        self.node = node
        self.data_dir = data_dir
        self.cgroups = cgroups
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.simulated = simulated
        self.gpu_memory = gpu_memory or {}
        self.mps = mps
        self.replicas: dict[Key, dict[int, LocalReplica]] = {}
        self.events: BackendEvents | None = None
        self.watchers: set[asyncio.Task] = set()

    @property
    def limits(self) -> str:
        return self.cgroups.status.message

    async def open(self, events: BackendEvents) -> None:
        self.events = events
        await asyncio.to_thread(self.cgroups.setup)

    # ------------------------------------------------------------------ launch

    async def launch(self, launch: AttemptLaunch) -> StartFailure | None:
        started: list[LocalReplica] = []
        for replica in launch.replicas:
            try:
                started.append(await self._start(launch, replica))
            except StartError as exc:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, exc.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                return StartFailure(replica, exc.reason, exc.message)
        self.replicas[launch.key] = {rep.replica: rep for rep in started}
        await self.events.replicas_started(launch.key, self.node, [rep.replica for rep in started])
        for rep in started:
            task = asyncio.create_task(self._watch(rep))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)
        return None

    async def _start(self, launch: AttemptLaunch, replica: int) -> LocalReplica:
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
                raise StartError(FailureReason.START_FAILED, f"working directory {cwd} does not exist")
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
        if cgroup is not None:  # started through the cgroup's shell, a missing command is only an exit code
            try:
                check_command(argv[0], cwd, env.get("PATH"))
            except StartError:
                Cgroups.remove(cgroup)
                raise
        sink = RotatingLog(files.log, self.log_max_bytes, self.log_backups)
        read_fd, write_fd = os.pipe()
        try:
            proc = await start_child(Cgroups.wrap(argv, cgroup), cwd=cwd, env=env, output_fd=write_fd)
        except OSError as exc:
            os.close(read_fd)
            sink.close()
            Cgroups.remove(cgroup)
            if isinstance(exc, FileNotFoundError):
                raise StartError(FailureReason.COMMAND_NOT_FOUND, not_found(argv[0])) from None
            if isinstance(exc, PermissionError):
                raise StartError(
                    FailureReason.START_FAILED, f"permission denied: {argv[0]} is not executable"
                ) from None
            raise StartError(
                FailureReason.START_FAILED, f"cannot start {argv[0]}: {exc.strerror or exc}"
            ) from None
        finally:
            os.close(write_fd)
        pump = _LogPump(read_fd, sink)
        write_pid_file(
            files.pid,
            {
                "pid": proc.pid,
                "start": process_start_time(proc.pid),
                "node": self.node,
                "cgroup": str(cgroup) if cgroup else None,
            },
        )
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
            ReplicaEnded(
                job_id=rep.job_id,
                attempt=rep.attempt,
                replica=rep.replica,
                node=self.node,
                exit_code=exit_code,
                signal=sig,
                reason=reason,
                message=message,
                log_tail=tail if reason else [],
            )
        )

    # ------------------------------------------------------------------ stop, adopt, close

    async def stop(self, key: Key, grace: float) -> None:
        reps = list(self.replicas.get(key, {}).values())
        await asyncio.gather(*(terminate(rep.proc, grace) for rep in reps))

    async def adopt(self, key: Key, replicas: dict[int, str]) -> bool:
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

    def started_before(self, key: Key) -> bool:
        """Whether an earlier executor started processes of this attempt here (its pid files remain)."""
        return bool(read_pid_files(self.data_dir, key[0], key[1], self.node))

    def sessions(self, key: Key) -> dict[int, int]:
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
