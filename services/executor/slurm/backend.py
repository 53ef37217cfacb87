"""The Slurm backend behind the executor's lifecycle: one executor serves a Slurm cluster, each replica a batch job
pinned to the node GPUYARD's scheduler chose (`batch.py`), through the same `Backend` interface as local processes.

- watching: Slurm's queue is read every `poll_interval` (`squeue --states=all`, one call for every job): a
  replica's batch job RUNNING → `replicas_started`, ended → `replica_ended` with what its state means
  (`outcomes.py`); a batch job Slurm no longer lists is read from its exit file, and is lost (NODE_LOST, the
  attempt requeued) when it left none. Between two readings, the running replicas' exit files are looked at every
  `exit_check_interval`: a normal end shows there first, and is reported at once (ends side by side).
- logs (`logs.py`): each batch job's output file (in the spool folder, which the compute nodes share) is copied into the
  replica's log file in the data directory as it grows and completely at its end, so the submit API and the log
  store serve it as they serve the local backend's (`gpuyard logs -f`), size-capped and rotated alike.
- stop (cancel, preemption, timeout, a failed peer): Slurm signals SIGTERM to every process of the batch jobs
  (`scancel --signal=TERM --full`); those still running after the grace are cancelled (Slurm's SIGKILL), and
  those still waiting to start at once.
- storage (`storage.py`): each batch job's checkpoint and output folders and volumes, made in the storage root
  before `sbatch`; its outputs copied to the output store once the attempt's last batch job has ended.
- a refusal of `sbatch` that is the cluster's state of the moment (`SlurmError.transient`: a controller
  restarting) is a `NodeFault`: the attempt is requeued, not failed.
- adopt (after an executor restart): the batch jobs are found again by their names (job, attempt, replica); an
  attempt none of whose batch jobs Slurm lists, and that left no exit file, is not adopted (and is requeued).
- nodes: the cluster's nodes, read every heartbeat (`sinfo`; `cluster.py` says what each heartbeat holds, and
  when a node is announced closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
import time
from pathlib import Path

from gpuyard.services.executor.backend import AttemptLaunch, Backend, BackendEvents, NotOpened, poll_forever
from gpuyard.services.executor.exits import AttemptKey, NodeFault, ReplicaKey, replica_exit
from gpuyard.services.executor.jobenv import replica_env
from gpuyard.services.executor.logfile import LogBudget
from gpuyard.services.executor.slurm import batch, commands
from gpuyard.services.executor.slurm.cluster import SlurmNode, cluster_inventory, not_placeable
from gpuyard.services.executor.slurm.commands import SlurmError
from gpuyard.services.executor.slurm.exitwatch import ExitWatch
from gpuyard.services.executor.slurm.logs import SpoolLogs
from gpuyard.services.executor.slurm.outcomes import finished, outcome, over_memory
from gpuyard.services.executor.slurm.queue import SlurmJob, job_name
from gpuyard.services.executor.slurm.storage import SlurmStorage, StorageRefused
from gpuyard.shared.contracts.events.jobs import FailureReason, JobPlaced, JobReplicaExited
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.runtime.jobusers import JobUser, JobUsers
from gpuyard.shared.runtime.paths import STORAGE
from gpuyard.shared.settings.slurm import SlurmConfig
from gpuyard.shared.stores.logs.shipper import LogShipper

log = logging.getLogger(__name__)
LOST = "Slurm no longer lists its batch job {slurm_id}, which left no exit file"
STOP_POLL = 0.2
NODE_LOSS_WAIT = 15.0
"""Seconds a replica's node loss waits at most for a heartbeat announcing its node closed."""


class SlurmBackend(Backend):
    name = "slurm"
    runs_every_node = True

    def __init__(
        self,
        config: SlurmConfig,
        *,
        data_dir: Path,
        job_users: JobUsers | None = None,
        grace: float = 10.0,
        log_max_bytes: int = 0,
        log_backups: int = 0,
        shipper: LogShipper | None = None,
        log_budget: LogBudget | None = None,
        storage_root: Path | None = None,
        volume_store: str = "",
        output_store: str = "",
    ):
        """`storage_root`: where jobs' checkpoint and output folders and volumes are, which every compute node
        must see at the same path (None: `storage/` in the data dir, the default of a platform whose jobs run
        as its own user); `volume_store`, `output_store`: the object stores of volumes and kept outputs."""
        self.config = config
        self.data_dir = data_dir
        self.spool = str(batch.spool_folder(config, data_dir))
        self.job_users = job_users or JobUsers({"*": None}, derive_base=None)
        self.storage = SlurmStorage(
            storage_root or Path(data_dir) / STORAGE,
            self.job_users,
            volume_store=volume_store,
            output_store=output_store,
        )
        self.attempt_notes: dict[AttemptKey, list[str]] = {}
        """What could not be done for an attempt's replicas (a volume's read-only), for its `job.started`."""
        self.grace = grace
        self.events: BackendEvents = NotOpened()
        self.live: dict[AttemptKey, dict[int, str]] = {}
        """Attempts launched or adopted: replica → GPUYARD node, for the replicas not yet reported ended."""
        self.tenants: dict[AttemptKey, str] = {}
        self.queue: dict[ReplicaKey, SlurmJob] = {}
        """GPUYARD's batch jobs as Slurm listed them last (the newest per replica)."""
        self.jobs: list[SlurmJob] = []
        """Every job Slurm listed last (outside jobs included)."""
        self.submitted: dict[AttemptKey, dict[int, tuple[str, float]]] = {}
        """Replica → (Slurm job id, since when) of each batch job this process submitted (since `sbatch` returned)
        or saw listed, until its attempt is released: a reading of the queue that began before then cannot list
        it yet; one after then that does not list it finds it gone."""
        self.queue_read_at = 0.0
        """When the last reading of the queue began (time.monotonic)."""
        self.started: dict[AttemptKey, set[int]] = {}
        """The replicas of each attempt reported started."""
        self.logs = SpoolLogs(
            self.spool,
            data_dir,
            max_bytes=log_max_bytes,
            backups=log_backups,
            shipper=shipper,
            budget=log_budget,
        )
        self.cluster: dict[str, SlurmNode] = {}
        self.skipped_nodes: dict[str, str] = {}
        self.node_losses: dict[ReplicaKey, float] = {}
        """Replicas whose node failed, since when, until a heartbeat has announced their node closed."""
        self.outside: dict[str, str] = {}
        """Node → what Slurm jobs outside GPUYARD hold on it, as last logged."""
        self.poller: asyncio.Task | None = None
        self.exit_watch: asyncio.Task | None = None
        self.reporting: set[ReplicaKey] = set()
        """Replicas whose end, seen in their exit file, is being reported."""
        self.looks: set[asyncio.Task] = set()
        """Looks at the exit files still reporting what they saw."""
        self.exit_files = ExitWatch()

    @property
    def limits(self) -> str:
        return "enforced by Slurm where its cgroup plugins constrain them (--cpus-per-task, --mem)"

    def notes(self, key: AttemptKey) -> list[str]:
        return list(self.attempt_notes.get(key, ()))

    # ------------------------------------------------------------------ watching

    async def open(self, events: BackendEvents) -> None:
        self.events = events
        await self.read_queue()  # (what runs is known before the executor reconciles: `started_before`)
        self.exit_files.open()
        self.poller = asyncio.create_task(
            poll_forever(self.poll_once, self.config.poll_interval, "reading Slurm's queue failed", log),
            name="slurm-poll",
        )
        self.exit_watch = asyncio.create_task(self._exit_loop(), name="slurm-exits")

    async def _exit_loop(self) -> None:
        """Ends seen in the replicas' exit files, between two readings of the queue: what frees a GPU soonest.
        Each look reports in a task of its own: the next look does not wait for the writes of this one's; an exit
        file written in a watched spool folder (`exitwatch.py`) brings the next look forward."""
        while True:
            look = asyncio.create_task(self.check_exit_files(), name="slurm-exit-look")
            self.looks.add(look)
            look.add_done_callback(self._looked)
            with contextlib.suppress(TimeoutError):  # (woken at once where inotify sees an exit file written)
                await asyncio.wait_for(self.exit_files.written.wait(), self.config.exit_check_interval)
            self.exit_files.written.clear()

    def _looked(self, look: asyncio.Task) -> None:
        self.looks.discard(look)
        if not look.cancelled() and (exc := look.exception()) is not None:
            log.warning("reading the batch jobs' exit files failed: %s", exc)

    async def check_exit_files(self) -> None:
        ended = [
            (key, replica, exited)
            for key, nodes in list(self.live.items())
            for replica, node in list(nodes.items())
            if (*key, replica) not in self.reporting
            and (exited := self._from_exit_file(key, replica, node)) is not None
            and exited.signal is None
        ]  # (a command killed by a signal waits for Slurm's word: its node failed, it timed out, was cancelled...)
        idents = [(*key, replica) for key, replica, _ in ended]
        self.reporting.update(idents)  # (a look meanwhile passes them over: each end is reported once)
        try:  # (reported side by side: each report is a write to the event store)
            await asyncio.gather(*(self._exit_found(key, replica, exited) for key, replica, exited in ended))
        finally:
            self.reporting.difference_update(idents)

    async def _exit_found(self, key: AttemptKey, replica: int, exited: JobReplicaExited) -> None:
        await self._started(key, replica)  # (it ran: it wrote its exit file)
        await self._ended(key, replica, exited)

    async def read_queue(self) -> None:
        began = time.monotonic()
        jobs = await commands.jobs()
        queue: dict[ReplicaKey, SlurmJob] = {}
        for job in jobs:
            key = job.replica_key
            if key is not None and (key not in queue or int(job.slurm_id) > int(queue[key].slurm_id)):
                queue[key] = job
        self.jobs, self.queue, self.queue_read_at = jobs, queue, began

    async def poll_once(self) -> None:
        await self.read_queue()
        changes = [(key, replica) for key, nodes in self.live.items() for replica in list(nodes)]
        await asyncio.gather(*(self._follow(key, replica) for key, replica in changes))

    async def _follow(self, key: AttemptKey, replica: int) -> None:
        ident = (*key, replica)
        nodes = self.live.get(key)
        if nodes is None or replica not in nodes or ident in self.reporting:
            return  # stopped meanwhile, or its end (its exit file's) being reported
        job = self.queue.get(ident)
        if job is None:
            exited = self._unlisted(key, replica, nodes[replica])
            if exited is not None:
                if exited.reason != FailureReason.NODE_LOST:
                    await self._started(key, replica)  # (it ran: it wrote its exit file)
                await self._ended(key, replica, exited)
            return
        self.submitted.setdefault(key, {}).setdefault(replica, (job.slurm_id, 0.0))
        if job.running or finished(job):
            await self._started(key, replica)
        if finished(job):
            ended = outcome(job)
            tail = self.logs.tail(key, replica) if ended[2] else []
            exit_code, sig, reason, message = over_memory(ended, tail, job)
            if reason == FailureReason.NODE_LOST and self._node_still_open(ident, job):
                return  # (reported once a heartbeat has announced its node closed: not placed on again)
            await self._ended(
                key,
                replica,
                replica_exit(
                    *key,
                    replica,
                    nodes[replica],
                    exit_code=exit_code,
                    signal=sig,
                    reason=reason,
                    message=message,
                    log_tail=tail,
                ),
            )
        else:
            self.logs.copy(key, replica, self.tenants.get(key, ""))

    def _unlisted(self, key: AttemptKey, replica: int, node: str) -> JobReplicaExited | None:
        """The end of a replica whose batch job the queue did not list: its exit file's, or lost; None while it
        is being submitted, or was submitted after this reading of the queue began."""
        exited = self._from_exit_file(key, replica, node)
        if exited is not None:
            return exited
        submitted = self.submitted.get(key, {}).get(replica)
        if submitted is None or submitted[1] > self.queue_read_at:
            return None
        return replica_exit(
            *key, replica, node, reason=FailureReason.NODE_LOST, message=LOST.format(slurm_id=submitted[0])
        )

    def _node_still_open(self, ident: ReplicaKey, job: SlurmJob) -> bool:
        """Whether the last `sinfo` still saw the lost job's node open, for at most `NODE_LOSS_WAIT` seconds."""
        first = self.node_losses.setdefault(ident, time.monotonic())
        node = self.cluster.get(job.nodes)
        if node is None or not_placeable(node) is not None or time.monotonic() - first > NODE_LOSS_WAIT:
            self.node_losses.pop(ident, None)
            return False
        return True

    async def _started(self, key: AttemptKey, replica: int) -> None:
        started = self.started.setdefault(key, set())
        if replica not in started:
            started.add(replica)
            await self.events.replicas_started(key, self.live[key][replica], [replica])

    async def _ended(self, key: AttemptKey, replica: int, exited: JobReplicaExited) -> None:
        nodes = self.live.get(key)
        if nodes is None or nodes.pop(replica, None) is None:
            return
        tenant = self.tenants.get(key, "")
        last = not nodes
        if last:
            self.live.pop(key, None)
        published = await self.storage.publish(tenant, key.job_id) if last else None
        self.logs.copy(key, replica, tenant, final=True, note=published)
        await self.events.replica_ended(exited)

    def _from_exit_file(self, key: AttemptKey, replica: int, node: str) -> JobReplicaExited | None:
        """The replica's end from the exit file its batch script wrote (None: it wrote none)."""
        files = batch.spool_files(self.spool, *key, replica)
        try:
            code = int(Path(files.exit).read_text().strip())
        except (OSError, ValueError):
            return None
        if code == 0:
            return replica_exit(*key, replica, node, exit_code=0)
        if code > 128:  # (the shell's word for a command killed by signal N: 128 + N)
            return replica_exit(
                *key,
                replica,
                node,
                signal=code - 128,
                reason=FailureReason.SIGNAL,
                message=f"killed by signal {code - 128}",
                log_tail=self.logs.tail(key, replica),
            )
        return replica_exit(
            *key,
            replica,
            node,
            exit_code=code,
            reason=FailureReason.EXIT_CODE,
            message=f"exited with code {code}",
            log_tail=self.logs.tail(key, replica),
        )

    # ------------------------------------------------------------------ nodes

    async def nodes(self, own: NodeHeartbeat) -> list[NodeHeartbeat]:
        self.cluster = await commands.nodes(self.config.partition)
        inventory = cluster_inventory(
            self.cluster,
            self.jobs,
            interval_seconds=own.interval_seconds,
            gpu_model=self.config.default_gpu_model,
            gpu_memory=self.config.default_gpu_memory,
            labels={"limits": self.limits},
        )
        for name, why in sorted(inventory.skipped.items()):
            if self.skipped_nodes.get(name) != why:
                log.info("Slurm node %s closed: %s", name, why)
        self.skipped_nodes = inventory.skipped
        outside = {hb.node: hb.labels.get("slurm_outside", "") for hb in inventory.heartbeats}
        for name, said in sorted(outside.items()):
            if self.outside.get(name, "") != said:
                log.info("Slurm node %s: %s", name, said or "no GPU held by Slurm jobs outside GPUYARD")
        self.outside = outside
        return [hb.model_copy(update={"gateway": own.gateway}) for hb in inventory.heartbeats]

    # ------------------------------------------------------------------ launch, stop, adopt, release

    def started_before(self, key: AttemptKey) -> bool:
        """Whether batch jobs of the attempt may have been submitted: Slurm lists one, or its spool folder (made
        before the first `sbatch`) is there."""
        spool = os.path.dirname(batch.spool_files(self.spool, *key, 0).output)
        return any(ident[:2] == key for ident in self.queue) or os.path.isdir(spool)

    async def launch(self, launch: AttemptLaunch) -> JobReplicaExited | None:
        if launch.spec.command is None:
            return launch.start_failed("the Slurm backend runs a command: this job has none")
        wanted = launch.spec.environment
        if wanted is not None and (wanted.wants_build or wanted.image):
            return launch.start_failed("the Slurm backend runs jobs in the nodes' own Python environment")
        if not self.cluster:
            with contextlib.suppress(SlurmError):
                self.cluster = await commands.nodes(self.config.partition)
        self.tenants[launch.key] = launch.tenant
        self.live[launch.key] = {r: launch.placement(r).node for r in launch.replicas}
        # (a redelivered launch submits nothing twice: the batch jobs Slurm lists are there already)
        todo = [r for r in launch.replicas if (*launch.key, r) not in self.queue]
        done = await asyncio.gather(*(self._submit(launch, r) for r in todo), return_exceptions=True)
        failed = [(r, e) for r, e in zip(todo, done, strict=True) if isinstance(e, BaseException)]
        if launch.key not in self.live:  # stopped while its batch jobs were submitted: none of them may run
            await self._cancel_submitted(launch, done, todo)
            return None
        if not failed:
            return None
        self.live.pop(launch.key, None)
        await self._cancel_submitted(launch, done, [r for r, _ in failed])
        replica, exc = failed[0]
        if isinstance(exc, StorageRefused):
            return launch.start_failed(str(exc))
        if isinstance(exc, SlurmError) and exc.transient:  # (requeued after the retry backoff, not failed)
            raise NodeFault(replica, f"Slurm could not take the batch job of replica {replica} now: {exc}")
        if not isinstance(exc, SlurmError | OSError):
            raise exc  # (a NodeFault among them: the attempt is requeued)
        return launch.start_failed(f"Slurm refused the batch job of replica {replica}: {exc}")

    async def _cancel_submitted(self, launch: AttemptLaunch, done: list, unsure: list[int]) -> None:
        """Cancel the batch jobs `done` submitted, and by name those of the replicas `unsure` (an `sbatch` that
        failed or took too long may have been taken all the same)."""
        with contextlib.suppress(SlurmError):
            await commands.scancel([e for e in done if isinstance(e, str)])
        for r in unsure:
            with contextlib.suppress(SlurmError):
                await commands.scancel_named(job_name(launch.job_id, launch.attempt, r))

    def _user(self, tenant: str) -> tuple[JobUser | None, bool]:
        user = self.job_users.for_tenant(tenant)
        if user is None:
            return None, False
        try:
            pwd.getpwuid(user.uid)
        except KeyError:
            return user, False
        return user, True

    def _master(self, launch: AttemptLaunch) -> str:
        nodes = {p.node for p in launch.placements}
        if len(nodes) == 1:
            return launch.master_addr
        first = launch.placement(0).node
        node = self.cluster.get(first)
        return node.address if node is not None else first

    async def _submit(self, launch: AttemptLaunch, replica: int) -> str:
        placement = launch.placement(replica)
        files = batch.spool_files(self.spool, launch.job_id, launch.attempt, replica)
        user, has_account = self._user(launch.tenant)
        workdir = launch.spec.working_dir or self.config.working_dir or files.workdir
        for folder in {os.path.dirname(files.output), files.workdir}:
            os.makedirs(folder, exist_ok=True)
            if user is not None:
                os.chown(folder, user.uid, user.gid)
        self.exit_files.watch(os.path.dirname(files.exit))
        kept = await self.storage.prepare(
            tenant=launch.tenant,
            job_id=launch.job_id,
            replica=replica,
            volumes=launch.spec.volumes,
            cwd=workdir,
            user=user,
        )
        notes = self.attempt_notes.setdefault(launch.key, [])
        notes += [note for note in kept.mounts.notes if note not in notes]
        placed = JobPlaced(job_id=launch.job_id, attempt=launch.attempt, placements=launch.placements)
        env = replica_env(
            job_id=launch.job_id,
            job_name=launch.job_name,
            tenant=launch.tenant,
            spec=launch.spec,
            placed=placed,
            replica=placement,
            master_addr=self._master(launch),
            master_port=launch.master_port,
            simulated=False,
            storage=kept.storage,
        )
        env.update(kept.mounts.env)
        if placement.gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # (Slurm's, for the devices it gave)
        args = batch.sbatch_args(
            job_id=launch.job_id,
            attempt=launch.attempt,
            tenant=launch.tenant,
            spec=launch.spec,
            placement=placement,
            node=self.cluster.get(placement.node),
            files=files,
            workdir=workdir,
            user=user,
            user_has_account=has_account,
            grace=self.grace,
            config=self.config,
        )
        text = batch.script(
            env=env,
            spec=launch.spec,
            files=files,
            user=user,
            user_has_account=has_account,
            title=f"GPUYARD job {launch.job_id} attempt {launch.attempt} replica {replica}",
        )
        slurm_id = await commands.sbatch(args, text, env)
        self.submitted.setdefault(launch.key, {})[replica] = (slurm_id, time.monotonic())
        return slurm_id

    def _slurm_ids(self, key: AttemptKey, replicas) -> list[str]:
        ids = []
        for replica in replicas:
            ident = (*key, replica)
            job = self.queue.get(ident)
            if job is not None and job.active:
                ids.append(job.slurm_id)
            elif job is None and (submitted := self.submitted.get(key, {}).get(replica)) is not None:
                ids.append(submitted[0])
        return ids

    async def stop(self, key: AttemptKey, grace: float) -> None:
        nodes = self.live.pop(key, None)
        if not nodes:
            return
        ids = self._slurm_ids(key, nodes)
        # A batch job still waiting to start is cancelled at once (`scancel --signal` would wait for it to start);
        # a refusal (one ended meanwhile, the controller away) leaves the rest to the cancel after the grace.
        try:
            pending = await self._pending(ids)
            running = [i for i in ids if i not in pending]
            if pending:
                await commands.scancel(pending)
            if running:
                await commands.scancel(running, signal="TERM")
        except SlurmError as exc:
            log.info("signalling job %s attempt %d in Slurm: %s", *key, exc)
        try:
            killed = not await self._ended_within(ids, grace)
        except SlurmError as exc:  # (the queue unread: cancelled all the same)
            log.info("reading the end of job %s attempt %d in Slurm: %s", *key, exc)
            killed = True
        if killed:  # (a pending one too, which would otherwise start later)
            try:
                await commands.scancel(ids)
            except SlurmError as exc:
                log.warning("cancelling job %s attempt %d in Slurm: %s", *key, exc)
        sig = signal.SIGKILL if killed else signal.SIGTERM
        tenant = self.tenants.get(key, "")
        published = await self.storage.publish(tenant, key.job_id)
        for replica, node in sorted(nodes.items()):
            self.logs.copy(
                key, replica, tenant, final=True, note=published if replica == max(nodes) else None
            )
            await self.events.replica_ended(
                replica_exit(
                    *key,
                    replica,
                    node,
                    signal=int(sig),
                    reason=FailureReason.SIGNAL,
                    message=f"stopped in Slurm: SIGTERM, {'then cancelled after' if killed else 'ended within'} "
                    f"the grace ({grace:g}s)",
                )
            )

    async def _pending(self, ids: list[str]) -> list[str]:
        """Those of the Slurm jobs still waiting to start, as the queue says now."""
        wanted = set(ids)
        return [j.slurm_id for j in await commands.jobs() if j.slurm_id in wanted and j.state == "PENDING"]

    async def _ended_within(self, ids: list[str], grace: float) -> bool:
        """Whether the Slurm jobs all left the running states within `grace` seconds."""
        deadline = time.monotonic() + grace
        wanted = set(ids)
        while True:
            jobs = await commands.jobs()
            if not any(j.active for j in jobs if j.slurm_id in wanted):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(STOP_POLL)

    async def adopt(self, key: AttemptKey, replicas: dict[int, str], *, unannounced: bool = False) -> bool:
        await self.read_queue()
        found = [r for r in replicas if (*key, r) in self.queue]
        exits = [r for r in replicas if Path(batch.spool_files(self.spool, *key, r).exit).exists()]
        if not found and not exits:
            return False
        self.live[key] = dict(replicas)
        self.exit_files.watch(os.path.dirname(batch.spool_files(self.spool, *key, 0).exit))
        jobs = [self.queue[(*key, r)] for r in found]
        comment = jobs[0].comment if jobs else ""
        self.tenants[key] = comment.partition("tenant=")[2].strip()
        for replica in replicas:
            if (*key, replica) not in self.queue:
                self.submitted.setdefault(key, {})[replica] = ("?", 0.0)  # (its end: its exit file, or lost)
            if not unannounced:
                self.started.setdefault(key, set()).add(replica)
        return True

    async def release(self, key: AttemptKey) -> None:
        self.live.pop(key, None)
        self.exit_files.forget(os.path.dirname(batch.spool_files(self.spool, *key, 0).exit))
        self.tenants.pop(key, None)
        self.attempt_notes.pop(key, None)
        self.logs.forget(key)
        self.started.pop(key, None)
        self.submitted.pop(key, None)
        for ident in [i for i in self.node_losses if i[:2] == key]:  # (a few at most)
            self.node_losses.pop(ident)

    async def close(
        self, grace: float, *, stop_jobs: bool = True
    ) -> None:  # batch jobs stay, whatever the stop
        for task in (self.poller, self.exit_watch, *self.looks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.exit_files.close()
        self.logs.close()
