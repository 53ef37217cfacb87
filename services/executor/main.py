"""Wiring of the executor: announce this node (Kubernetes: the cluster's GPU nodes), start the replicas
placed on it, report how they end, and stop them on cancel, preemption, timeout or a GPU memory slice overrun.

The lifecycle here is the same for every backend (`backend.py`): local process groups (`local.py`) or
Kubernetes pods (`kubernetes/backend.py`, `--executor-backend kubernetes`).

Idempotent on every event: an attempt is started at most once per executor (and only while the job is
`placed` for that attempt, and never when an earlier executor already started it), and every event it
records has a deterministic id.

Several executor processes may share a node (`executor_workers`, local backend): `job.placed` goes to one of
them (a durable consumer they share), every one of them sees the control events (cancel, preemption, the
attempt's end: a durable consumer each), an attempt's claim file says which one runs it (`claims.py`), and
worker 0 announces the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from datetime import UTC, datetime, timedelta

from services.executor.backend import AttemptLaunch, Backend, Key, ReplicaEnded, StartFailure
from services.executor.cgroups import Cgroups
from services.executor.claims import Claims
from services.executor.gpuwatch import (
    GpuProcessReader,
    NvmlProcessReader,
    Overuse,
    SliceWatch,
    WatchedReplica,
)
from services.executor.jobenv import mps_running, share_bytes
from services.executor.local import LocalBackend
from shared.events import (
    EVENTS_STREAM,
    AlertRaised,
    AlertResolved,
    CloudEvent,
    EventData,
    FailureReason,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    JobSucceeded,
    NodeHeartbeat,
    RequeueReason,
    Subject,
    derived_id,
    make_event,
)
from shared.gpus import host_cpus, host_memory, node_gpus
from shared.jobstate import JobState, JobView
from shared.ledger import Decide, JobLedger
from shared.service import Service
from shared.settings import ExecutorSettings
from shared.units import format_size, parse_size

log = logging.getLogger(__name__)
LIMITS_NOT_ENFORCED = "not enforced on this node"
LAUNCHES_AT_ONCE = 16
CONTROL_SUBJECTS = [
    "job.cancel_requested",
    "job.preempted",
    "job.cancelled",
    "job.failed",
    "job.succeeded",
    "job.requeued",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_address() -> str:
    """This host's address as other nodes would reach it (MASTER_ADDR of distributed jobs): the source
    address of its default route (no packet is sent), else what its hostname resolves to."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def make_backend(settings: ExecutorSettings, *, simulated: bool, gpu_memory: dict[int, int]) -> Backend:
    if settings.executor_backend == "kubernetes":
        from services.executor.kubernetes.backend import KubernetesBackend
        from services.executor.kubernetes.controller import KubernetesController

        try:
            from services.executor.kubernetes.client_api import ClientKubeApi

            api = ClientKubeApi.from_environment(settings.kubeconfig or None)
        except Exception as exc:
            raise RuntimeError(
                "the kubernetes backend needs in-cluster credentials (a service account) or a kubeconfig "
                f"(GPUYARD_KUBECONFIG): {exc}"
            ) from exc
        return KubernetesBackend(
            KubernetesController(api, settings.kubernetes),
            data_dir=settings.data_dir,
            poll_interval=settings.kubernetes.poll_interval,
            log_interval=settings.kubernetes.log_interval,
            log_max_bytes=settings.log_max_bytes,
            log_backups=settings.log_backups,
        )
    mps = settings.mps == "on" or (settings.mps == "auto" and not simulated and mps_running())
    return LocalBackend(
        node=settings.node_name,
        data_dir=settings.data_dir,
        cgroups=Cgroups(settings.cgroup_root, settings.cgroup_parent or None, enabled=settings.cgroup_limits),
        log_max_bytes=settings.log_max_bytes,
        log_backups=settings.log_backups,
        simulated=simulated,
        gpu_memory=gpu_memory,
        mps=mps,
    )


class Executor:
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
        self.gpus, self.simulated = node_gpus(
            self.node,
            settings.simulate_gpus,
            settings.simulated_gpu_model,
            parse_size(settings.simulated_gpu_memory),
        )
        self.gpu_memory = {g.index: g.memory_bytes for g in self.gpus}
        self.backend = backend or make_backend(settings, simulated=self.simulated, gpu_memory=self.gpu_memory)
        self.address = settings.advertise_address or default_address()
        self.addresses: dict[str, str] = {self.node: self.address}
        self.running: dict[Key, set[int]] = {}
        """Replicas of each attempt launched (or adopted) by this executor and not yet ended."""
        self.attempts: dict[Key, AttemptLaunch] = {}
        self.launched: set[Key] = set()
        self.stop_reasons: dict[Key, str] = {}
        self.stop_messages: dict[Key, str] = {}
        self.stop_graces: dict[Key, float] = {}
        self.timers: dict[Key, asyncio.Task] = {}
        self.launching = asyncio.Semaphore(LAUNCHES_AT_ONCE)
        """Launches in progress at once: a burst of placements starts (and records) job after job, instead of
        starting every process of the burst before the first start is recorded."""
        self.tasks: set[asyncio.Task] = set()
        self.nodes_unavailable = False
        """The backend failed to list its nodes last round (logged once per outage)."""
        self.announced: list[str] = []
        self.gpu_reader = self._gpu_reader(gpu_reader)
        self.slice_watch = SliceWatch(
            "warn" if settings.gpu_memory_policy == "off" else settings.gpu_memory_policy,
            settings.gpu_memory_grace,
            settings.gpu_memory_slack,
        )

    def _gpu_reader(self, given: GpuProcessReader | None) -> GpuProcessReader | None:
        if given is not None:
            return given
        why = None
        if self.settings.gpu_memory_policy == "off":
            why = "turned off (GPUYARD_GPU_MEMORY_POLICY=off)"
        elif self.simulated or not self.gpus:
            why = "this node has no NVIDIA GPU" + (" (its GPUs are simulated)" if self.simulated else "")
        elif self.settings.executor_backend != "local":
            why = "the Kubernetes backend leaves GPU sharing to the device plugin"
        else:
            reader = NvmlProcessReader()
            if reader.available:
                return reader
            why = f"NVML is not available ({reader.error})"
        log.info("GPU memory slices are not watched on this node: %s", why)
        return None

    async def start(self) -> None:
        await self.backend.open(self)
        limits = self.backend.limits
        if limits:
            log.info("cpu and memory limits of jobs: %s", limits)

    # ------------------------------------------------------------------ node

    def heartbeat(self) -> NodeHeartbeat:
        labels = {"hostname": socket.gethostname(), "address": self.address, "backend": self.backend.name}
        if self.backend.limits:
            labels["limits"] = self.backend.limits
        return NodeHeartbeat(
            node=self.node,
            gpus=self.gpus,
            cpus=host_cpus(),
            memory_bytes=host_memory(),
            simulated=self.simulated,
            labels=labels,
            interval_seconds=self.settings.heartbeat_interval,
        )

    async def announce_once(self) -> list[NodeHeartbeat]:
        """Publish one heartbeat (fresh id) per node the backend reports: this node (local backend) or the
        cluster's GPU nodes (Kubernetes). When the backend cannot list them, nothing is announced this
        round (the scheduler's node timeout decides what that means) and the outage is logged once."""
        try:
            heartbeats = await self.backend.nodes(self.heartbeat())
        except Exception as exc:
            if not self.nodes_unavailable:
                log.warning(
                    "cannot list the nodes to announce (%s: %s); announcing none until it works again",
                    type(exc).__name__,
                    exc,
                )
            self.nodes_unavailable = True
            return []
        if self.nodes_unavailable:
            log.info("listing the nodes to announce works again")
            self.nodes_unavailable = False
        names = sorted(hb.node for hb in heartbeats)
        if self.backend.runs_every_node and names != self.announced:
            gpus = sum(len(hb.gpus) for hb in heartbeats)
            log.info("announcing %d node(s) with %d GPU(s): %s", len(names), gpus, ", ".join(names) or "none")
        self.announced = names
        for heartbeat in heartbeats:
            with contextlib.suppress(Exception):
                await self.service.bus.publish(make_event(heartbeat, source=self.service.source))
        return heartbeats

    async def announce(self) -> None:
        if self.backend.runs_every_node:
            log.info("backend %s: announcing the nodes it runs replicas on", self.backend.name)
        else:
            kind = "simulated" if self.simulated else "NVIDIA"
            log.info("node %s: %d %s GPU(s), backend %s", self.node, len(self.gpus), kind, self.backend.name)
        while True:
            await self.announce_once()
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def on_heartbeat(self, msg) -> None:
        """Learn the other nodes' addresses (for MASTER_ADDR of jobs spread over several nodes)."""
        try:
            event = CloudEvent.from_json(msg.data)
        except ValueError:
            return
        data = event.data
        if isinstance(data, NodeHeartbeat) and data.labels.get("address"):
            self.addresses[data.node] = data.labels["address"]

    async def publish(self, data: EventData, event_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.service.bus.publish(make_event(data, source=self.service.source, id=event_id))

    def mine(self, placements) -> list:
        return [p for p in placements if self.backend.runs_every_node or p.node == self.node]

    # ------------------------------------------------------------------ events

    async def on_event(self, event: CloudEvent, _msg) -> None:
        data = event.data
        if isinstance(data, JobPlaced):
            if self.mine(data.placements):
                await self.launch(data)
        elif isinstance(data, JobCancelRequested):
            await self.cancel(data.job_id)
        elif isinstance(data, JobPreempted):
            await self.stop_attempt((data.job_id, data.attempt), "preempted", data.grace_seconds)
        elif isinstance(data, JobFailed | JobCancelled | JobSucceeded | JobRequeued):
            ended = data.attempt - 1 if isinstance(data, JobRequeued) else data.attempt
            await self.end_attempt((data.job_id, ended))

    async def reconcile(self) -> None:
        """After a (re)start: start what was placed here and never started; adopt what still runs where the
        backend can watch it again, else record it lost (the scheduler requeues it)."""
        cursor = None
        while True:
            page = await self.service.store.list_projections(
                states=["placed", "running"], limit=500, cursor=cursor
            )
            for doc in page.items:
                view = JobView.model_validate(doc)
                key = (view.job_id, view.attempt)
                mine = self.mine(view.placements)
                if not mine or key in self.running or key in self.launched:
                    continue
                never_started = view.state == JobState.PLACED and view.current.started_at is None
                if never_started and not self.backend.started_before(key):
                    placed = JobPlaced(job_id=view.job_id, attempt=view.attempt, placements=view.placements)
                    await self.launch(placed)  # (unless another worker of this node claims it first)
                    continue
                if not self.claims.owns(key):
                    continue  # another executor process of this node runs it
                ended = {e.replica for e in view.exits}
                replicas = {p.replica: p.node for p in mine if p.replica not in ended}
                if replicas and await self.backend.adopt(key, replicas):
                    await self.adopted(view, replicas)
                else:
                    await self.record_lost(view)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def adopted(self, view: JobView, replicas: dict[int, str]) -> None:
        key = (view.job_id, view.attempt)
        self.launched.add(key)
        self.running[key] = set(replicas)
        self.attempts[key] = await self._attempt(
            view, JobPlaced(job_id=view.job_id, attempt=view.attempt, placements=view.placements)
        )
        log.info("job %s attempt %d: watching its %d replica(s) again", *key, len(replicas))
        if view.spec.timeout:
            started = view.current.started_at or view.updated_at
            left = view.spec.timeout - (datetime.now(UTC) - started).total_seconds()
            self.timers[key] = self._spawn(self.enforce_timeout(key, max(left, 0)))

    async def record_lost(self, view: JobView) -> None:
        await self.ledger.requeue_lost(
            view, f"the executor of node {self.node} restarted and lost the job's processes"
        )

    # ------------------------------------------------------------------ launching

    async def address_of(self, node: str) -> str:
        """A node's address from its heartbeats; a just-started executor waits for them a little, then
        falls back to the node's name (right when node names are host names)."""
        for _ in range(int(self.settings.heartbeat_interval * 20) + 20):
            if node in self.addresses:
                break
            await asyncio.sleep(0.1)
        return self.addresses.get(node, node)

    async def _attempt(self, view: JobView, placed: JobPlaced) -> AttemptLaunch:
        placements = list(placed.placements)
        mine = self.mine(placements)
        master = next(p for p in placements if p.replica == 0)
        if all(p.node == self.node for p in placements) or self.backend.runs_every_node:
            master_addr, master_port = "127.0.0.1", free_port()
        else:  # several nodes: every node's executor must name the same address and port
            master_addr = await self.address_of(master.node)
            master_port = 29500 + int(derived_id(view.job_id, view.attempt, "port")[:8], 16) % 2000
        return AttemptLaunch(
            job_id=view.job_id,
            job_name=view.name,
            tenant=view.tenant,
            attempt=view.attempt,
            spec=view.spec,
            placements=placements,
            replicas=[p.replica for p in mine],
            master_addr=master_addr,
            master_port=master_port,
        )

    async def launch(self, placed: JobPlaced) -> None:
        key = (placed.job_id, placed.attempt)
        if key in self.launched:
            return
        view = await self.ledger.load(placed.job_id)
        if view is None or view.attempt != placed.attempt or not self.not_started_here(view):
            return  # stale placement: cancelled, requeued, or this node's replicas already started
        if not self.claims.take(key):
            return  # another executor process of this node runs it
        self.launched.add(key)
        if view.cancel_requested:
            await self.finish(key, JobCancelled(job_id=view.job_id, attempt=view.attempt, by="executor"))
            return
        attempt = await self._attempt(view, placed)
        self.attempts[key] = attempt
        self.running[key] = set(attempt.replicas)
        async with self.launching:
            failure = await self.backend.launch(attempt)
        if failure is not None:
            await self.failed_to_start(key, failure)
        elif key in self.stop_reasons or key not in self.attempts:
            # stopped (cancel, preemption) or over (requeued) while its replicas were starting
            await self.backend.stop(key, self.stop_graces.get(key, self.settings.grace_seconds))
        elif view.spec.timeout and self.running.get(key):  # the time limit counts from the start
            self.timers[key] = self._spawn(self.enforce_timeout(key, view.spec.timeout))

    def not_started_here(self, view: JobView) -> bool:
        """The attempt is placed, or running on other nodes only (a gang's first replicas may start before
        this node's), and none of this node's replicas has started or ended."""
        if view.state == JobState.PLACED:
            return True
        if view.state != JobState.RUNNING:
            return False
        done = {*view.current.started, *(e.replica for e in view.exits)}
        return not any(p.replica in done for p in self.mine(view.placements))

    async def failed_to_start(self, key: Key, failure: StartFailure) -> None:
        job_id, attempt = key
        self.running.pop(key, None)
        await self.record_exit(
            key,
            JobReplicaExited(
                job_id=job_id,
                attempt=attempt,
                node=self.node,
                replica=failure.replica,
                reason=failure.reason,
                message=failure.message,
            ),
        )

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ------------------------------------------------------------------ what the backend reports

    async def replicas_started(self, key: Key, node: str, replicas: list[int]) -> None:
        job_id, attempt = key
        limits = self.backend.limits
        notes = [f"cpu and memory limits {limits}"] if LIMITS_NOT_ENFORCED in limits else []
        await self.ledger.append(
            job_id,
            JobStarted(job_id=job_id, attempt=attempt, node=node, replicas=replicas, notes=notes),
            event_id=derived_id(job_id, attempt, "started", node, ",".join(map(str, sorted(replicas)))),
        )

    async def replica_ended(self, ended: ReplicaEnded) -> None:
        key = ended.key
        stop = self.stop_reasons.get(key)
        reason, message = ended.reason, ended.message
        if stop == "timeout":
            spec_timeout = self.attempts[key].spec.timeout if key in self.attempts else None
            reason = FailureReason.TIMEOUT
            message = f"timed out after {spec_timeout:g}s and was stopped" if spec_timeout else "timed out"
        elif stop == "gpu_memory":
            reason = FailureReason.GPU_MEMORY_EXCEEDED
            message = self.stop_messages.get(key, "used more GPU memory than its slice")
        self.running.get(key, set()).discard(ended.replica)
        if reason is not None and stop is None:
            self._spawn(self.stop_attempt(key, "peer_failed", self.settings.grace_seconds))
        await self.record_exit(
            key,
            JobReplicaExited(
                job_id=ended.job_id,
                attempt=ended.attempt,
                node=ended.node,
                replica=ended.replica,
                exit_code=ended.exit_code,
                signal=ended.signal,
                reason=reason,
                message=message,
                log_tail=ended.log_tail if reason else [],
            ),
        )

    async def record_exit(self, key: Key, exited: JobReplicaExited) -> None:
        """The replica's exit, and how the attempt ended when that exit settles it, in one append."""
        job_id, attempt = key
        outcome = await self.ledger.record(
            job_id,
            lambda _view: exited,
            event_id=lambda _view: derived_id(job_id, attempt, "exited", exited.replica),
            then=self.settling(key),
            then_id=lambda _view: derived_id(job_id, attempt, "ended"),
            cached=True,
        )
        if outcome.applied:
            log.debug("job %s attempt %d: %s", job_id, attempt, outcome.event.type.rsplit(".", 1)[-1])

    # ------------------------------------------------------------------ settling

    def settling(self, key: Key) -> Decide | None:
        """How the attempt ended, to decide once the replicas' exits say so (None: not yet)."""
        job_id, attempt = key
        stop = self.stop_reasons.get(key)
        if self.running.get(key):
            if stop in ("cancelled", "preempted"):
                return None  # wait until every local replica is gone
        else:
            self.running.pop(key, None)
            timer = self.timers.pop(key, None)
            if timer and timer is not asyncio.current_task():  # (a timeout's stop may end up here)
                timer.cancel()

        def decide(view: JobView | None):
            if (
                view is None
                or view.attempt != attempt
                or view.state not in (JobState.PLACED, JobState.RUNNING)
            ):
                return None
            if stop == "cancelled" or view.cancel_requested:
                return JobCancelled(
                    job_id=job_id, attempt=attempt, by="executor", message="cancelled while running"
                )
            if stop == "preempted":
                why = view.preempt_requested.reason if view.preempt_requested else "preempted"
                return JobRequeued(
                    job_id=job_id, attempt=attempt + 1, reason=RequeueReason.PREEMPTED, message=why
                )
            failed = [e for e in view.exits if e.reason is not None]
            if failed:
                first = failed[0]
                if attempt <= view.spec.max_retries:
                    backoff = self.settings.retry_backoff * 2 ** (attempt - 1)
                    return JobRequeued(
                        job_id=job_id,
                        attempt=attempt + 1,
                        reason=RequeueReason.RETRY,
                        message=f"retry {attempt}/{view.spec.max_retries} after: {first.message}",
                        not_before=datetime.now(UTC) + timedelta(seconds=backoff),
                        exit_code=first.exit_code,
                    )
                return JobFailed(
                    job_id=job_id,
                    attempt=attempt,
                    reason=first.reason,
                    message=f"replica {first.replica}: {first.message}",
                    exit_code=first.exit_code,
                    signal=first.signal,
                    replica=first.replica,
                    log_tail=view.log_tail,
                )
            if len({e.replica for e in view.exits}) == view.spec.replicas and view.state == JobState.RUNNING:
                return JobSucceeded(job_id=job_id, attempt=attempt)
            return None

        return decide

    async def finish(self, key: Key, data) -> None:
        await self.ledger.append(key[0], data, event_id=derived_id(key[0], key[1], "ended"))

    # ------------------------------------------------------------------ stopping

    async def cancel(self, job_id: str) -> None:
        view = await self.ledger.load(job_id)
        if view is None or not self.mine(view.placements):
            return
        key = (job_id, view.attempt)
        if self.running.get(key):
            await self.stop_attempt(key, "cancelled", self.settings.grace_seconds)
        elif view.state in (JobState.PLACED, JobState.RUNNING) and self.claims.take(key):
            # not started here: the claim keeps this node's other executor processes from starting it
            await self.finish(key, JobCancelled(job_id=job_id, attempt=view.attempt, by="executor"))

    async def enforce_timeout(self, key: Key, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.stop_attempt(key, "timeout", self.settings.grace_seconds)

    async def stop_attempt(self, key: Key, reason: str, grace: float) -> None:
        if not self.running.get(key):
            return
        self.stop_reasons.setdefault(key, reason)
        self.stop_graces.setdefault(key, grace)
        log.info("stopping job %s attempt %d (%s), grace %.0fs", key[0], key[1], reason, grace)
        await self.backend.stop(key, grace)

    async def end_attempt(self, key: Key) -> None:
        """The attempt is over (succeeded, failed, cancelled, requeued): stop what is left, free the rest."""
        await self.stop_attempt(key, "ended", self.settings.grace_seconds)
        if self.attempts.pop(key, None) is not None:
            await self.backend.release(key)
        self.slice_watch.forget(*key)
        self.stop_reasons.pop(key, None)
        self.stop_messages.pop(key, None)
        self.stop_graces.pop(key, None)

    # ------------------------------------------------------------------ GPU memory slices

    def watched_replicas(self) -> list[WatchedReplica]:
        watched = []
        for key, replicas in self.running.items():
            attempt = self.attempts.get(key)
            if attempt is None:
                continue
            sessions = self.backend.sessions(key)
            for replica in replicas:
                if replica not in sessions:
                    continue
                slices = {
                    g.index: size
                    for g in attempt.placement(replica).gpus
                    if g.fraction < 1
                    and (size := share_bytes(g.fraction, g.memory_bytes, self.gpu_memory.get(g.index)))
                }
                if slices:
                    watched.append(WatchedReplica(*key, replica, sessions[replica], slices))
        return watched

    async def check_gpu_memory(self) -> None:
        watched = self.watched_replicas()
        if not watched or self.gpu_reader is None:
            return
        usage = await asyncio.to_thread(self.gpu_reader)
        verdicts = self.slice_watch.check(usage, watched)
        policy = self.settings.gpu_memory_policy
        for over in verdicts.over:
            then = (
                f"it is stopped if it stays over for {self.settings.gpu_memory_grace:g}s"
                if policy == "stop"
                else "node policy: warn only"
            )
            message = (
                f"job {over.job_id} replica {over.replica} uses {format_size(over.used_bytes)} of GPU "
                f"{over.gpu_index}, over its slice of {format_size(over.slice_bytes)}; {then}"
            )
            log.warning(message)
            await self.publish(
                AlertRaised(
                    alert_id=over.alert_id,
                    kind="gpu_memory_over_slice",
                    severity="warning",
                    message=message,
                    node=self.node,
                    gpu_index=over.gpu_index,
                    job_id=over.job_id,
                ),
                derived_id(over.alert_id, "raised", over.since),
            )
        for back in verdicts.back:
            await self.publish(
                AlertResolved(
                    alert_id=back.alert_id, kind="gpu_memory_over_slice", message="back in its slice"
                ),
                derived_id(back.alert_id, "resolved", back.since),
            )
        for over in verdicts.stop:
            self.stop_for_gpu_memory(over)

    def stop_for_gpu_memory(self, over: Overuse) -> None:
        key = (over.job_id, over.attempt)
        self.stop_messages[key] = (
            f"used {format_size(over.used_bytes)} of GPU {over.gpu_index}'s memory, over its slice of "
            f"{format_size(over.slice_bytes)}, for more than {self.settings.gpu_memory_grace:g}s "
            "(node policy: stop)"
        )
        self._spawn(self.stop_attempt(key, "gpu_memory", self.settings.grace_seconds))

    async def watch_gpu_memory(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gpu_memory_interval)
            try:
                await self.check_gpu_memory()
            except Exception as exc:  # NVML hiccups must not stop the executor
                log.warning("reading GPU memory of jobs failed: %s", exc)

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Executor stopping: local processes are stopped (a restart requeues them as lost); pods stay."""
        for task in list(self.tasks):
            task.cancel()
        await self.backend.close(min(self.settings.grace_seconds, 3))
        close = getattr(self.gpu_reader, "close", None)
        if close:
            close()


async def main(service: Service, settings: ExecutorSettings) -> None:
    executor = Executor(service, settings)
    await executor.start()
    if executor.worker == 0:  # one heartbeat per node, whatever the number of its executor processes
        service.spawn(executor.announce(), "heartbeat")
    await service.bus.subscribe(Subject.NODE_HEARTBEAT.value, executor.on_heartbeat)
    if executor.gpu_reader is not None:
        service.spawn(executor.watch_gpu_memory(), "gpu-memory-watch")
    try:
        await executor.reconcile()
        durable = f"executor-{settings.node_name}".replace(".", "-")
        for name, subjects in (  # placements shared by the node's executor processes; the rest to each
            (durable, ["job.placed"]),
            (f"{durable}-{executor.worker}", CONTROL_SUBJECTS),
        ):
            await service.bus.consume(
                name,
                subjects,
                executor.on_event,
                stream=EVENTS_STREAM.name,
                max_deliver=settings.max_deliver,
                concurrency=settings.event_concurrency,
            )
        await service.stopping.wait()
    finally:
        await executor.shutdown()
