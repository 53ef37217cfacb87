"""The executor's lifecycle, the same for every backend (`backend.py`): start the replicas placed on this node
(Kubernetes: on any node), record how they end, and stop them on cancel, preemption, timeout or a GPU memory
slice overrun. Each attempt it holds is one record in its registry (`attempts.py`), from its claim to its end.

Idempotent on every event: an attempt is started at most once per executor (and only while the job is
`placed` for that attempt, and never when an earlier executor already started it), and every event it
records has a deterministic id.

A serve job (`spec.serve`) is not the executor's: its replica is a session held by the serving service of
the node it is placed on (docs/architecture.md, "Model deployments"), which records its start, its end and its
cancel. The executor never starts, adopts or cancels one (`hosts`).

Several executor processes may share a node (`executor_workers`, local backend): `job.placed` goes to one of
them, every one of them sees the control events, and an attempt's claim file says which one runs it
(`claims.py`).

When it acts on an event is the protocol of every host of attempts (`gpuyard.shared.runtime.hosting`): a
placement, a cancel or preemption, the attempt's end, each once the event store holds it; the executor adds
the monitor's idle warning and stop (`on_idle_warning`, `on_idle_stop`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg

from gpuyard.services.executor.announce import NodeAnnouncer
from gpuyard.services.executor.attempts import Attempt, Attempts
from gpuyard.services.executor.backend import AttemptLaunch, Backend
from gpuyard.services.executor.backends import make_backend
from gpuyard.services.executor.claims import Claims
from gpuyard.services.executor.classify import attempt_end, exit_after_stop, node_fault
from gpuyard.services.executor.exits import AttemptKey, NodeFault, attempt_key
from gpuyard.services.executor.gpuguard import SliceGuard, choose_reader
from gpuyard.services.executor.gpuwatch import GpuProcessReader, Overuse
from gpuyard.services.executor.logfile import NOTE
from gpuyard.services.executor.rendezvous import master_endpoint
from gpuyard.shared.bus.headers import entity_of
from gpuyard.shared.contracts.events.alerts import IdleStop, IdleWarning
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, derived_id
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobState, JobView, state_values
from gpuyard.shared.contracts.stops import STOPS_AWAITING_EVERY_REPLICA, StopReason
from gpuyard.shared.contracts.units import parse_size
from gpuyard.shared.gpus.inventory import node_gpus
from gpuyard.shared.runtime.hosting import AttemptHost, StopRequest, ignored
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.stores.events import ConcurrencyError, EventStore
from gpuyard.shared.stores.ledger import Decide, JobLedger, Outcome
from gpuyard.shared.stores.logs.shipper import LogShipper
from gpuyard.shared.stores.readmodels import idlebook

log = logging.getLogger(__name__)
LIMITS_NOT_ENFORCED = "not enforced on this node"
LAUNCHES_AT_ONCE = 16
MAX_BACKOFF_DOUBLINGS = 6
"""An attempt requeued for the node's fault waits the retry backoff, doubled per attempt up to 2^6 times (5 s
to 5 min 20 s with the default backoff)."""
IDLE_SUBJECTS = (Subject.IDLE_WARNING.value, Subject.IDLE_STOP.value)


class Executor(AttemptHost):
    def __init__(
        self,
        service: Service,
        settings: ExecutorSettings,
        *,
        backend: Backend | None = None,
        gpu_reader: GpuProcessReader | None = None,
    ):
        self.service = service
        self.settings = settings
        self.node = settings.node_name
        self.worker = settings.executor_worker
        self.claims = Claims(settings.data_dir, self.node, self.worker, shared=settings.executor_workers > 1)
        self.ledger: JobLedger = service.ledger
        self.store: EventStore = service.store
        gpus, simulated = node_gpus(
            self.node,
            settings.simulate_gpus,
            settings.simulated_gpu_model,
            parse_size(settings.simulated_gpu_memory),
        )
        gpu_memory = {g.index: g.memory_bytes for g in gpus}
        self.shipper = (
            LogShipper(service.logs, max_bytes=settings.log_max_bytes * (settings.log_backups + 1))
            if service.needs_logs
            else None
        )
        """Replicas' output to the log store, where the API reads it from any node."""
        self.backend = backend or make_backend(
            settings, simulated=simulated, gpu_memory=gpu_memory, shipper=self.shipper, store=self.store
        )
        self.attempts = Attempts()
        self.nodes = NodeAnnouncer(service, settings, self.backend, gpus=gpus, simulated=simulated)
        self.gpu_guard = SliceGuard(
            service,
            settings,
            reader=choose_reader(settings, simulated=simulated, has_gpus=bool(gpus), given=gpu_reader),
            backend=self.backend,
            attempts=self.attempts,
            gpu_memory=gpu_memory,
            stop=self.stop_for_gpu_memory,
        )
        self.launching = asyncio.Semaphore(LAUNCHES_AT_ONCE)
        """Launches in progress at once: a burst of placements starts (and records) job after job, instead of
        starting every process of the burst before the first start is recorded."""
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        if self.shipper is not None:
            self.shipper.start()
        await self.backend.open(self)

    def mine(self, placements: Sequence[ReplicaPlacement]) -> list[ReplicaPlacement]:
        return [p for p in placements if self.backend.runs_every_node or p.node == self.node]

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ------------------------------------------------------------------ the hosting protocol (hosting.py)

    def places_here(self, placements: Sequence[ReplicaPlacement]) -> bool:
        return bool(self.mine(placements))

    @staticmethod
    def hosts(view: JobView) -> bool:
        """Whether the job's replicas are the executor's to run: every job's but a serve job's."""
        return view.spec.serve is None

    def holds(self, job_id: str, attempt: int) -> bool:
        return AttemptKey(job_id, attempt) in self.attempts

    def runs(self, job_id: str, attempt: int) -> bool:
        record = self.attempts.get(AttemptKey(job_id, attempt))
        return record is not None and bool(record.running)

    def holds_job(self, job_id: str) -> bool:
        return self.attempts.holds_job(job_id)

    async def on_placed(self, placed: JobPlaced, view: JobView) -> None:
        await self.launch(placed, view)

    async def on_stop_requested(self, stop: StopRequest) -> None:
        """Stop what runs of the attempt here; a cancelled attempt not started here is recorded cancelled, once
        this executor process claims it (the claim keeps the node's other executor processes from starting
        it)."""
        key = AttemptKey(stop.job_id, stop.attempt)
        record = self.attempts.get(key)
        if record is not None and record.running:
            grace = self.settings.grace_seconds if stop.grace is None else stop.grace
            await self.stop_attempt(key, stop.why, grace)
        elif stop.why == StopReason.CANCELLED and stop.view.state in ACTIVE_STATES and self.claims.take(key):
            await self.finish(key, JobCancelled(job_id=stop.job_id, attempt=stop.attempt, by="executor"))

    async def on_attempt_ended(self, job_id: str, attempt: int) -> None:
        await self.end_attempt(AttemptKey(job_id, attempt))

    def more_handlers(self) -> dict:
        return {IdleWarning: self.on_idle_warning, IdleStop: self.on_idle_stop}

    def concerns(self, msg: Msg) -> bool:
        """Whether an event for this executor process's own consumer may concern it (every executor process
        sees every job's end, and acts only on those of the attempts it holds): `concerns_holder`; the
        monitor's idle warnings and stops likewise."""
        if msg.subject in IDLE_SUBJECTS:
            job_id = entity_of(msg)
            return job_id is None or self.attempts.holds_job(job_id)
        return super().concerns(msg)

    # ------------------------------------------------------------------ launching

    async def launch(self, placed: JobPlaced, view: JobView | None = None) -> None:
        """Start this node's replicas of the placed attempt. `view`: the job as the store has it now (read
        here when not given)."""
        key = AttemptKey(placed.job_id, placed.attempt)
        record = self.attempts.open(key)
        if record is None:
            return  # already taken on here (a redelivered placement)
        if view is None:
            view = await self.ledger.load(placed.job_id)
        if (
            view is None
            or view.attempt != placed.attempt
            or not self.hosts(view)
            or not self.not_started_here(view)
        ):
            self.attempts.close(
                record
            )  # stale placement: cancelled, requeued, or this node's replicas started
            return
        try:
            claimed = self.claims.take(key)
        except OSError as exc:  # (its attempt's folder, or its claim, on a full disk)
            if (why := node_fault(exc)) is None:
                self.attempts.close(record)
                raise
            fault = NodeFault(None, f"node {self.node} could not start the attempt: {why} (its claim)")
            await self.requeue_after_fault(key, view, fault)
            return
        if not claimed:
            self.attempts.close(record)  # another executor process of this node runs it
            return
        if view.cancel_requested:
            self.attempts.close(record)
            await self.finish(key, JobCancelled(job_id=view.job_id, attempt=view.attempt, by="executor"))
            return
        launch = record.launch = await self.attempt_launch(view)
        record.running = set(launch.replicas)
        try:
            async with self.launching:
                failure = await self.backend.launch(launch)
        except NodeFault as fault:
            record.running.clear()
            await self.requeue_after_fault(key, view, fault)
            return
        if failure is not None:
            record.running.clear()
            await self.record_exit(failure)
        elif record.stop_reason is not None or record.over:
            # stopped (cancel, preemption) or over (requeued) while its replicas were starting
            grace = self.settings.grace_seconds if record.stop_grace is None else record.stop_grace
            await self.backend.stop(key, grace)
        elif view.spec.timeout and record.running:  # the time limit counts from the start
            record.timer = self._spawn(self.enforce_timeout(key, view.spec.timeout))

    async def requeue_after_fault(self, key: AttemptKey, view: JobView, fault: NodeFault) -> None:
        """A replica could not start for the node's fault (`NodeFault`: its disk full): the attempt is requeued
        as a new one, as one whose processes were lost, after the job's retry backoff for its attempt (a node
        that stays full is not tried again at once), whatever retries the job allows. Should the requeue not be
        written (the event store's disk full too), the attempt is let go here, for a redelivered placement to
        try again."""
        backoff = self.settings.retry_backoff * 2 ** min(key.attempt - 1, MAX_BACKOFF_DOUBLINGS)
        try:
            outcome = await self.ledger.requeue_lost(
                view, fault.message, not_before=datetime.now(UTC) + timedelta(seconds=backoff)
            )
        except BaseException:
            record = self.attempts.get(key)
            if record is not None:
                self.attempts.close(record)
            raise
        if outcome.applied:
            log.warning("job %s attempt %d requeued: %s", *key, fault.message)
        await self.end_attempt(key)

    def not_started_here(self, view: JobView) -> bool:
        """The attempt is placed, or running on other nodes only (a gang's first replicas may start before
        this node's), and none of this node's replicas has started or ended."""
        if view.state == JobState.PLACED:
            return True
        if view.state != JobState.RUNNING:
            return False
        done = {*view.current.started, *(e.replica for e in view.exits)}
        return not any(p.replica in done for p in self.mine(view.placements))

    async def attempt_launch(self, view: JobView) -> AttemptLaunch:
        placements = list(view.placements)
        local = self.backend.runs_every_node or all(p.node == self.node for p in placements)
        master_addr, master_port = await master_endpoint(
            view.job_id, view.attempt, placements, local=local, address_of=self.nodes.address_of
        )
        return AttemptLaunch(
            job_id=view.job_id,
            job_name=view.name,
            tenant=view.tenant,
            attempt=view.attempt,
            spec=view.spec,
            placements=placements,
            replicas=[p.replica for p in self.mine(placements)],
            master_addr=master_addr,
            master_port=master_port,
        )

    # ------------------------------------------------------------------ after a restart

    async def reconcile(self) -> None:
        """After a (re)start: start what was placed here and never started; adopt what still runs where the
        backend can watch it again, else record it lost (the scheduler requeues it)."""
        cursor = None
        while True:
            page = await self.store.list_projections(
                states=state_values(ACTIVE_STATES), limit=500, cursor=cursor
            )
            for doc in page.items:
                try:
                    await self.reconcile_job(JobView.model_validate(doc))
                except Exception:  # one job the executor cannot read or resume never stops it serving others
                    log.exception("job %s: cannot be reconciled; left as it is", doc.get("job_id", "?"))
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        try:
            await self.backend.stop_leftovers(self.wanted_here)
        except Exception:  # (what it could not stop is tried again at the next start)
            log.exception("cannot stop what is left of attempts that moved on while this node was away")

    async def wanted_here(self, key: AttemptKey) -> bool:
        """Whether the job still runs this attempt on this node (its current attempt, active, placed here):
        what is left of any other (the node was lost meanwhile) is stopped (`Backend.stop_leftovers`)."""
        if key in self.attempts:
            return True
        doc = await self.store.get_projection(key.job_id)
        if doc is None:
            return False
        view = JobView.model_validate(doc)
        return (
            view.attempt == key.attempt and view.state in ACTIVE_STATES and bool(self.mine(view.placements))
        )

    async def reconcile_job(self, view: JobView) -> None:
        key = AttemptKey(view.job_id, view.attempt)
        mine = self.mine(view.placements)
        if not mine or key in self.attempts or not self.hosts(view):
            return
        never_started = view.state == JobState.PLACED and view.current.started_at is None
        if not self.backend.runs_every_node:  # none of this node's replicas started, though a gang's others
            # may have, on other nodes (this node joined, or its consumer was not there yet, when it was placed)
            started_here = {p.replica for p in mine} & set(view.current.started)
            never_started = view.state in ACTIVE_STATES and not started_here
        if never_started and not self.backend.started_before(key):
            placed = JobPlaced(job_id=view.job_id, attempt=view.attempt, placements=view.placements)
            await self.launch(placed)  # (unless another worker of this node claims it first)
            return
        if not self.claims.owns(key):
            return  # another executor process of this node runs it
        ended = {e.replica for e in view.exits}
        replicas = {p.replica: p.node for p in mine if p.replica not in ended}
        if replicas and await self.adopt(view, key, replicas):
            return
        await self.ledger.requeue_lost(
            view, f"the executor of node {self.node} restarted and lost the job's processes"
        )

    async def adopt(self, view: JobView, key: AttemptKey, replicas: dict[int, str]) -> bool:
        """Take on again an attempt an earlier executor started here: its record is opened with the replicas
        not yet recorded ended, then the backend reports those that ended meanwhile and watches the rest.
        False when the backend cannot (it made sure nothing of the attempt still runs)."""
        record = self.attempts.open(key)
        if record is None:
            return True
        record.running = set(replicas)
        record.launch = await self.attempt_launch(view)
        unannounced = bool(set(replicas) - set(view.current.started))  # its executor died before it said so
        idle = await self.idle_stop_of(key)
        if idle is not None:  # its executor was stopping it for idle GPUs: it ends so, whenever it ends
            record.stopping(StopReason.IDLE, self.settings.grace_seconds)
            record.stop_message = idle.message
        if not await self.backend.adopt(key, replicas, unannounced=unannounced):
            self.attempts.close(record)
            return False
        if idle is not None and record.running:
            await self.backend.stop(key, self.settings.grace_seconds)
        log.info("job %s attempt %d: watching its %d replica(s) again", *key, len(record.running))
        if view.spec.timeout:
            started = view.current.started_at or view.updated_at
            left = view.spec.timeout - (datetime.now(UTC) - started).total_seconds()
            record.timer = self._spawn(self.enforce_timeout(key, max(left, 0)))
        return True

    # ------------------------------------------------------------------ what the backend reports

    async def replicas_started(self, key: AttemptKey, node: str, replicas: list[int]) -> None:
        job_id, attempt = key
        limits = self.backend.limits
        notes = [f"cpu and memory limits {limits}"] if LIMITS_NOT_ENFORCED in limits else []
        notes += self.backend.notes(key)
        started = JobStarted(
            job_id=job_id,
            attempt=attempt,
            node=node,
            replicas=replicas,
            notes=notes,
            isolation=self.backend.isolation(key),
        )
        event_id = derived_id(job_id, attempt, "started", node, ",".join(map(str, sorted(replicas))))
        # (on the view its launch read: should the job have moved on since, the store refuses the write and
        # the ledger decides again on the newer view)
        await self.written(lambda: self.ledger.append(job_id, started, event_id=event_id, cached=True))

    async def replica_ended(self, ended: JobReplicaExited) -> None:
        record = self.attempts.get(attempt_key(ended))
        stop = None
        if record is not None:
            record.running.discard(ended.replica)
            stop = record.stop_reason
            if stop is not None:
                timeout = record.launch.spec.timeout if record.launch else None
                ended = exit_after_stop(ended, stop, record.stop_message, timeout)
        if ended.reason is not None and stop is None:  # a failed replica stops its gang
            self._spawn(
                self.stop_attempt(attempt_key(ended), StopReason.PEER_FAILED, self.settings.grace_seconds)
            )
        await self.record_exit(ended)

    async def record_exit(self, exited: JobReplicaExited) -> None:
        """The replica's exit, and how the attempt ended when that exit settles it, in one append."""
        job_id, attempt = key = attempt_key(exited)
        outcome = await self.written(
            lambda: self.ledger.record(
                job_id,
                lambda _view: exited,
                event_id=lambda _view: derived_id(job_id, attempt, "exited", exited.replica),
                then=self.settling(key),
                then_id=lambda _view: derived_id(job_id, attempt, "ended"),
                cached=True,
            )
        )
        if outcome.applied and outcome.event is not None:  # (an applied write has its event)
            log.debug("job %s attempt %d: %s", job_id, attempt, outcome.event.type.rsplit(".", 1)[-1])
        view = outcome.view
        if view is not None and (view.state.terminal or view.attempt > attempt):
            await self.end_attempt(key)  # it ended here: no need to wait for its end event from the bus

    @staticmethod
    async def written(write: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """`write()` until the ledger stores it (or finds it stored, or refuses it): what a backend reports is
        seen once, so no one would record it if it were dropped. The ledger raises ConcurrencyError only when
        other processes' writes to the job (a gang's other nodes) kept landing first: they did land, so the
        job moves on, and this write is tried again, after a moment that spreads the writers apart."""
        while True:
            try:
                return await write()
            except ConcurrencyError as exc:
                log.info("%s; writing again", exc)
                await asyncio.sleep(random.uniform(0.01, 0.1))

    def settling(self, key: AttemptKey) -> Decide | None:
        """How the attempt ended, to decide once the replicas' exits say so (None: not yet)."""
        record = self.attempts.get(key)
        stop = None
        if record is not None:
            stop = record.stop_reason
            if record.running:
                if stop in STOPS_AWAITING_EVERY_REPLICA:
                    return None  # wait until every local replica is gone
            else:
                record.cancel_timer()
        attempt, backoff = key.attempt, self.settings.retry_backoff
        return lambda view: attempt_end(view, attempt, stop, backoff)

    async def finish(self, key: AttemptKey, data: EventData) -> None:
        await self.ledger.append(key.job_id, data, event_id=derived_id(key.job_id, key.attempt, "ended"))

    # ------------------------------------------------------------------ stopping

    async def on_idle_warning(self, data: IdleWarning, event: CloudEvent) -> None:
        """The monitor's idle warning: a line in the job's output."""
        record = await self.idle_attempt(data, event)
        if record is not None:
            self.backend.note(record.key, f"{NOTE}idle: {data.message}")

    async def on_idle_stop(self, data: IdleStop, event: CloudEvent) -> None:
        """The monitor's idle stop: the attempt is stopped as a preempted one is, then ends `failed`, reason
        `idle`."""
        record = await self.idle_attempt(data, event)
        if record is None:
            return
        grace = self.settings.grace_seconds
        self.backend.note(record.key, f"{NOTE}idle: {data.message}; SIGTERM now, SIGKILL in {grace:g}s")
        record.stop_message = data.message
        await self.stop_attempt(record.key, StopReason.IDLE, grace)

    async def idle_attempt(self, data: IdleWarning | IdleStop, event: CloudEvent) -> Attempt | None:
        """The record of the attempt an idle event is about, when it runs here, is not being stopped, and the
        store holds the event; None otherwise (a late or repeated event, or a forged one)."""
        record = self.attempts.get(AttemptKey(data.job_id, data.attempt))
        if record is None or not record.running or record.stop_reason is not None:
            return None  # not running here, or over, or already being stopped: a late or repeated event
        if not await idlebook.holds(self.store, event):
            ignored(event)
            return None
        return record

    async def idle_stop_of(self, key: AttemptKey) -> IdleStop | None:
        """The monitor's `idle.stop` of the attempt, when the store holds one."""
        for stored in await self.store.read_stream(idlebook.stream_id(key.job_id)):
            data = stored.event.data
            if isinstance(data, IdleStop) and data.attempt == key.attempt:
                return data
        return None

    async def enforce_timeout(self, key: AttemptKey, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.stop_attempt(key, StopReason.TIMEOUT, self.settings.grace_seconds)

    def stop_for_gpu_memory(self, over: Overuse, message: str) -> None:
        record = self.attempts.get(AttemptKey(over.job_id, over.attempt))
        if record is not None:
            record.stop_message = message
            self._spawn(self.stop_attempt(record.key, StopReason.GPU_MEMORY, self.settings.grace_seconds))

    async def stop_attempt(self, key: AttemptKey, reason: StopReason, grace: float) -> None:
        record = self.attempts.get(key)
        if record is None or not record.running:
            return
        record.stopping(reason, grace)
        log.info("stopping job %s attempt %d (%s), grace %.0fs", key[0], key[1], reason, grace)
        await self.backend.stop(key, grace)

    async def end_attempt(self, key: AttemptKey) -> None:
        """The attempt is over (succeeded, failed, cancelled, requeued): stop what is left, free the rest."""
        await self.stop_attempt(key, StopReason.ENDED, self.settings.grace_seconds)
        record = self.attempts.get(key)
        if record is None:
            return
        self.attempts.close(record)
        self.gpu_guard.forget(key)
        if record.launch is not None:
            await self.backend.release(key)

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self, *, stop_jobs: bool = True) -> None:
        """Executor stopping. A deliberate stop (`stop_jobs`) stops local processes (a restart requeues them
        as lost); otherwise (a restart, an upgrade) they go on and the next executor adopts them. Pods stay."""
        for task in list(self.tasks):
            task.cancel()
        await self.backend.close(min(self.settings.grace_seconds, 3), stop_jobs=stop_jobs)
        self.gpu_guard.close()
        if self.shipper is not None:
            await self.shipper.stop()  # what the replicas printed last
