"""Local process backend: each replica is its own process group (a new session) in its own working directory,
with the job's environment, CPU and memory limits through cgroup v2 where the node allows it, and its output
piped through the executor into a size-capped, rotated log file.

Replicas are started by the executor's reaper (`reaper/`), their parent, which outlives the executor: it
writes each replica's pid file (pid and start time, against pid reuse) and, when the replica ends, its exit
file, whether or not an executor still runs. A restarted executor (`adopt`) reports the exits written
meanwhile and watches the replicas still running until they end: an executor's restart never stops a job,
and never runs one twice. Only a replica gone without an exit record (its reaper killed too) makes the
attempt lost (the scheduler requeues it as a new attempt).

How a replica starts (its folders, user, environment, limits, log and pipe): `localstart.py`; what it sees of
the node's temporary folders and processes (a private /tmp, /dev/shm and /proc where the node allows):
`privatetmp.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuyard.services.executor.backend import AttemptLaunch, Backend, BackendEvents, NotOpened
from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.classify import classify_exit
from gpuyard.services.executor.environments.node import InUse, NodeEnvironments, environments_root
from gpuyard.services.executor.exits import AttemptKey, NodeFault, replica_exit
from gpuyard.services.executor.leftovers import running_attempts
from gpuyard.services.executor.localstart import LocalReplica, ReplicaStarter
from gpuyard.services.executor.logfile import NOTE, LogBudget, LogPump, RotatingLog, output_after, tail_lines
from gpuyard.services.executor.nodelog import node_log
from gpuyard.services.executor.outputpublish import OutputPublisher
from gpuyard.services.executor.pidfiles import PidRecord, read_pid_files
from gpuyard.services.executor.privatetmp import PrivateTmps
from gpuyard.services.executor.processes import (
    StartError,
    process_start_time,
    signal_group,
    stop_leftovers,
    terminate,
)
from gpuyard.services.executor.reaper_client import (
    ReapedProcess,
    ReaperClient,
    read_exit_file,
    watch_adopted,
)
from gpuyard.services.executor.start_helper import start_helper
from gpuyard.services.executor.volumecache import VolumeCache
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.jobs import FailureReason, JobReplicaExited
from gpuyard.shared.contracts.events.nodes import EnvironmentRemoveRequested, NodeHeartbeat
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.jobusers import SHARED_RIGHTS, JobUsers, platform_user, uid_key
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.paths import (
    PLATFORM_PYTHON_CLOSED,
    ReplicaFiles,
    replica_files,
    unreachable_to_others,
)
from gpuyard.shared.runtime.paths import storage_root as default_storage_root
from gpuyard.shared.settings.environments import EnvironmentSettings
from gpuyard.shared.stores.logs import LogKey
from gpuyard.shared.stores.logs.shipper import LogShipper

log = logging.getLogger(__name__)
LOST_MESSAGE = "its exit status was lost: its reaper ended before the replica"


def publisher_of(output_store: str, storage_root: Path, users: JobUsers) -> OutputPublisher | None:
    """What copies jobs' outputs to the output store once an attempt ends (None: no output store)."""
    return (
        OutputPublisher(OutputStore(output_store), storage_root, users.for_tenant) if output_store else None
    )


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
        job_root: Path,
        storage_root: Path | None = None,
        start_helper: bool = True,
        log_budget: LogBudget | None = None,
        volume_store: str = "",
        output_store: str = "",
        environments: EnvironmentSettings | None = None,
    ):
        """`log_budget`: what the running replicas of each tenant may hold of this process's logs together
        (`LogBudget`; None: no limit); `storage_root`: where jobs' checkpoint and output folders are (None: the
        default place, `gpuyard.shared.runtime.paths.storage_root`); `volume_store`: the object store volumes
        live in (`GPUYARD_VOLUME_STORE`; empty: folders of the storage root), copied to this node to be mounted;
        `output_store`: where jobs' outputs are copied once an attempt ends (`GPUYARD_OUTPUT_STORE`; empty: none);
        `environments`: the settings of jobs' own environments (None: read from the GPUYARD_ENVIRONMENT_*
        variables)."""
        self.node = node
        self.job_users = job_users or JobUsers({"*": None}, derive_base=None)
        self.job_root = job_root
        self.storage_root = storage_root or default_storage_root(
            None, data_dir, job_root, jobs_switch_users=self.job_users.switches
        )
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
        self.events: BackendEvents = NotOpened()
        self.watchers: set[asyncio.Task] = set()
        self.reaper = ReaperClient()
        self.start_helper = start_helper
        self.private = PrivateTmps(data_dir, job_root, self.storage_root)
        self.outputs = publisher_of(output_store, self.storage_root, self.job_users)
        env_settings = environments or EnvironmentSettings()
        self.environments = NodeEnvironments(
            environments_root(env_settings, data_dir, job_root, switches=self.job_users.switches),
            env_settings,
            node,
            alive=lambda job, attempt, replica: os.path.exists(
                replica_files(data_dir, job, attempt, replica).pid
            ),
            shared=self.job_users.switches,
        )
        self.starter = ReplicaStarter(
            node=node,
            data_dir=data_dir,
            job_users=self.job_users,
            job_root=job_root,
            storage_root=self.storage_root,
            cgroups=cgroups,
            reaper=self.reaper,
            private=self.private,
            open_log=self.open_log,
            simulated=simulated,
            gpu_memory=self.gpu_memory,
            mps=mps,
            volume_cache=VolumeCache(volume_store, self.storage_root, self.job_users.for_tenant)
            if volume_store
            else None,
            environments=self.environments,
        )

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
        await self.private.open(switches=self.job_users.switches)
        await asyncio.to_thread(self.environments.open)
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
                started.append(await self.starter.start(launch, replica))
            except NodeFault as fault:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, fault.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                await asyncio.to_thread(self.private.forget, launch.key)
                raise
            except StartError as exc:
                log.warning("job %s replica %d did not start: %s", launch.job_id, replica, exc.message)
                await asyncio.gather(*(self._discard(rep) for rep in started))
                await asyncio.to_thread(self.private.forget, launch.key)
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

    async def nodes(self, own: NodeHeartbeat) -> list[NodeHeartbeat]:
        """This node, with the Python versions it builds job environments for and the environments it holds."""
        offered = sorted(self.environments.pythons, key=lambda v: tuple(map(int, v.split("."))))
        held = await asyncio.to_thread(self.environments.announced)
        return [own.model_copy(update={"pythons": offered, "environments": held})]

    async def on_environment_remove(self, data: EnvironmentRemoveRequested, _event: CloudEvent) -> None:
        """An admin's `gpuyard envs rm`: the environment is deleted here, unless a running replica uses it (then
        it stays, said in the node's log); one this node does not hold (another node's, or gone) is nothing."""
        if data.node != self.node:
            return
        try:
            freed = await self.environments.remove(data.key)
        except InUse as exc:
            node_log.warning("environment %s not removed (asked by %s): %s", data.key, data.by or "?", exc)
            return
        if freed is not None:
            node_log.info(
                "environment %s removed (asked by %s): %s freed", data.key, data.by or "?", format_size(freed)
            )

    def isolation(self, key: AttemptKey) -> str:
        return self.private.isolation(key)

    def notes(self, key: AttemptKey) -> list[str]:
        """What the node could not do for the attempt's replicas started here, besides their limits (a volume's
        read-only not enforced: `volumemounts.py`), for its `job.started`."""
        return self.private.notes_of(key)

    def open_log(self, path: str, key: LogKey, tenant: str | None) -> RotatingLog:
        """A replica's log file (rotated, shipped to the log store), within its tenant's share of the log
        budget (none for one whose tenant is not known: a pid file that does not say whose)."""
        return RotatingLog(
            path,
            self.log_max_bytes,
            self.log_backups,
            shipper=self.shipper,
            key=key,
            budget=self.log_budget if tenant else None,
            tenant=tenant or "",
        )

    async def _finish_io(self, rep: LocalReplica, *, last: bool = False) -> None:
        """After the replica's first process ended: kill what is left of it, drain its log, copy the job's
        outputs to the output store when it was the attempt's `last` replica here (said in its log), and
        close the log."""
        signal_group(rep.proc.pid, signal.SIGKILL)
        Cgroups.kill(rep.cgroup)
        if rep.pump is not None:
            with contextlib.suppress(TimeoutError):  # (a process that left the group may hold the pipe open)
                await asyncio.wait_for(asyncio.shield(rep.pump.done), 5)
            rep.pump.close()
        if last and self.outputs is not None and rep.tenant:
            line = await self.outputs.publish(rep.tenant, rep.job_id)
            self._write_note(rep, f"{NOTE}{line}")
        if rep.sink is not None:
            rep.sink.close()

    async def _discard(self, rep: LocalReplica) -> None:
        self.environments.release((rep.key, rep.replica))
        await terminate(rep.proc, 2)
        await self._finish_io(rep)
        Cgroups.remove(rep.cgroup)
        with contextlib.suppress(OSError):
            os.unlink(rep.pid_file)

    async def _watch(self, rep: LocalReplica) -> None:
        returncode = await rep.proc.wait()
        rep.ended = True
        await self._finish_io(rep, last=all(r.ended for r in self.replicas.get(rep.key, {}).values()))
        await self._shipped()  # its output is in the log store before its end is: `logs -f` misses nothing
        reason: FailureReason | None  # (None: it succeeded)
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
        self.environments.release((rep.key, rep.replica))
        live = self.replicas.get(rep.key, {})
        live.pop(rep.replica, None)
        if not live:
            self.replicas.pop(rep.key, None)
            await asyncio.to_thread(self.private.forget, rep.key)
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
                await asyncio.to_thread(self.private.forget, key)
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

    async def stop_leftovers(self, wanted: Callable[[AttemptKey], Awaitable[bool]]) -> list[AttemptKey]:
        """Stop the replicas of this node still running for attempts this executor does not watch and the job
        no longer wants here (`gpuyard.services.executor.leftovers`): a node that was lost and comes back."""
        stopped = []
        running = await asyncio.to_thread(running_attempts, self.data_dir, self.node)
        for key, records in running.items():
            if key in self.replicas or await wanted(key):
                continue
            count = await stop_leftovers(records, grace=5)
            log.warning(
                "job %s attempt %d: moved on while this node was away; stopped %d replica(s)", *key, count
            )
            for path in (rec.path for rec in records):  # (nothing of it to find again)
                with contextlib.suppress(OSError):
                    os.unlink(path)
            stopped.append(key)
        return stopped

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
            assert rec is not None, "a replica that has not ended is still running: adopt found its pid file"
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
            tenant=rec.tenant if rec else "",
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
        sink = self.open_log(files.log, LogKey(key.job_id, key.attempt, replica), rec.tenant)
        return LogPump(read_fd, sink), sink

    def started_before(self, key: AttemptKey) -> bool:
        """Whether an earlier executor started processes of this attempt here (its pid files remain)."""
        return bool(read_pid_files(self.data_dir, key[0], key[1], self.node))

    def note(self, key: AttemptKey, line: str) -> None:
        for rep in self.replicas.get(key, {}).values():
            self._write_note(rep, line)

    @staticmethod
    def _write_note(rep: LocalReplica, line: str) -> None:
        if rep.sink is None:
            return
        try:  # (a line of its own, even after a line the job left unfinished)
            rep.sink.write(f"\n{line}\n".encode())
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
                self.private.forget(key)
        self.reaper.close()


def still_running(rec: PidRecord) -> bool:
    """The replica's first process still runs (or has ended and waits for its reaper), and its reaper too."""
    if rec.start is None or rec.reaper is None or process_start_time(rec.reaper) != rec.reaper_start:
        return False
    return process_start_time(rec.pid, zombie=True) == rec.start
