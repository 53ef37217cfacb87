"""Wiring of the executor: announce this node, start the replicas placed on it, report how they end,
and stop them on cancel, preemption or timeout.

Idempotent on every event: an attempt is started at most once per executor (and only while the job is
`placed` for that attempt), and every event it records has a deterministic id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

from services.executor.jobenv import replica_env
from services.executor.local import (
    ReplicaProcess,
    StartError,
    classify_exit,
    log_tail,
    start_replica,
    terminate,
)
from shared.events import (
    EVENTS_STREAM,
    CloudEvent,
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
    derived_id,
    make_event,
)
from shared.gpus import host_cpus, host_memory, node_gpus
from shared.jobstate import JobState, JobView
from shared.ledger import JobLedger
from shared.paths import log_path, workdir
from shared.service import Service
from shared.settings import ExecutorSettings
from shared.units import parse_size

log = logging.getLogger(__name__)
Key = tuple[str, int]  # (job id, attempt)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Executor:
    def __init__(self, service: Service, settings: ExecutorSettings):
        self.service = service
        self.settings = settings
        self.node = settings.node_name
        self.ledger: JobLedger = service.ledger
        self.gpus, self.simulated = node_gpus(
            self.node,
            settings.simulate_gpus,
            settings.simulated_gpu_model,
            parse_size(settings.simulated_gpu_memory),
        )
        self.procs: dict[Key, dict[int, ReplicaProcess]] = {}
        self.launched: set[Key] = set()
        self.stop_reasons: dict[Key, str] = {}
        self.timers: dict[Key, asyncio.Task] = {}
        self.tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ node

    def heartbeat(self) -> NodeHeartbeat:
        return NodeHeartbeat(
            node=self.node,
            gpus=self.gpus,
            cpus=host_cpus(),
            memory_bytes=host_memory(),
            simulated=self.simulated,
            labels={"hostname": socket.gethostname()},
            interval_seconds=self.settings.heartbeat_interval,
        )

    async def announce(self) -> None:
        kind = "simulated" if self.simulated else "NVIDIA"
        log.info("node %s: %d %s GPU(s)", self.node, len(self.gpus), kind)
        while True:
            with contextlib.suppress(Exception):
                await self.service.bus.publish(make_event(self.heartbeat(), source=self.service.source))
            await asyncio.sleep(self.settings.heartbeat_interval)

    # ------------------------------------------------------------------ events

    async def on_event(self, event: CloudEvent, _msg) -> None:
        data = event.data
        if isinstance(data, JobPlaced):
            if any(p.node == self.node for p in data.placements):
                await self.launch(data)
        elif isinstance(data, JobCancelRequested):
            await self.cancel(data.job_id)
        elif isinstance(data, JobPreempted):
            await self.stop_attempt((data.job_id, data.attempt), "preempted", data.grace_seconds)
        elif isinstance(data, JobFailed | JobCancelled | JobSucceeded | JobRequeued):
            ended = data.attempt - 1 if isinstance(data, JobRequeued) else data.attempt
            await self.stop_attempt((data.job_id, ended), "ended", self.settings.grace_seconds)

    async def reconcile(self) -> None:
        """After a (re)start: start what was placed here and never started; requeue what ran here and is lost."""
        cursor = None
        while True:
            page = await self.service.store.list_projections(
                states=["placed", "running"], limit=500, cursor=cursor
            )
            for doc in page.items:
                view = JobView.model_validate(doc)
                if (
                    not any(p.node == self.node for p in view.placements)
                    or (view.job_id, view.attempt) in self.procs
                ):
                    continue
                if view.state == JobState.PLACED and view.current.started_at is None:
                    placed = JobPlaced(job_id=view.job_id, attempt=view.attempt, placements=view.placements)
                    await self.launch(placed)
                else:
                    await self.record_lost(view)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def record_lost(self, view: JobView) -> None:
        data = JobRequeued(
            job_id=view.job_id,
            attempt=view.attempt + 1,
            reason=RequeueReason.NODE_LOST,
            message=f"the executor of node {self.node} restarted and lost the job's processes",
        )
        await self.ledger.append(
            view.job_id, data, event_id=derived_id(view.job_id, view.attempt, "requeued")
        )

    # ------------------------------------------------------------------ launching

    async def launch(self, placed: JobPlaced) -> None:
        key = (placed.job_id, placed.attempt)
        if key in self.launched:
            return
        view = await self.ledger.load(placed.job_id)
        if view is None or view.state != JobState.PLACED or view.attempt != placed.attempt:
            return  # stale placement: cancelled, requeued or already running
        self.launched.add(key)
        if view.cancel_requested:
            await self.finish(key, JobCancelled(job_id=view.job_id, attempt=view.attempt, by="executor"))
            return
        mine = [p for p in placed.placements if p.node == self.node]
        all_here = all(p.node == self.node for p in placed.placements)
        master = next(p for p in placed.placements if p.replica == 0)
        master_addr = "127.0.0.1" if all_here else master.node
        master_port = free_port() if all_here else 29500 + int(placed.job_id[:4], 16) % 2000
        spec = view.spec
        started: list[int] = []
        self.procs[key] = {}
        for p in mine:
            env = replica_env(
                job_id=view.job_id,
                job_name=view.name,
                tenant=view.tenant,
                spec=spec,
                placed=placed,
                replica=p,
                master_addr=master_addr,
                master_port=master_port,
                simulated=self.simulated,
            )
            data_dir = self.settings.data_dir
            cwd = (
                Path(spec.working_dir)
                if spec.working_dir
                else workdir(data_dir, view.job_id, view.attempt, p.replica)
            )
            if not spec.working_dir:
                cwd.mkdir(parents=True, exist_ok=True)
            path = log_path(data_dir, view.job_id, view.attempt, p.replica)
            try:
                proc = await start_replica(spec.argv, cwd, env, path)
            except StartError as exc:
                await self.replica_failed_to_start(view, p.replica, exc)
                return
            self.procs[key][p.replica] = ReplicaProcess(view.job_id, view.attempt, p.replica, proc, path)
            started.append(p.replica)
        await self.ledger.append(
            view.job_id,
            JobStarted(job_id=view.job_id, attempt=view.attempt, node=self.node, replicas=started),
            event_id=derived_id(view.job_id, view.attempt, "started", self.node),
        )
        for rp in self.procs[key].values():
            self._spawn(self.watch(rp, view))
        if spec.timeout:
            self.timers[key] = self._spawn(self.enforce_timeout(key, spec.timeout))

    async def replica_failed_to_start(self, view: JobView, replica: int, exc: StartError) -> None:
        key = (view.job_id, view.attempt)
        log.warning("job %s replica %d did not start: %s", view.job_id, replica, exc.message)
        await self.stop_attempt(key, "peer_failed", self.settings.grace_seconds)
        await self.ledger.append(
            view.job_id,
            JobReplicaExited(
                job_id=view.job_id,
                attempt=view.attempt,
                node=self.node,
                replica=replica,
                reason=exc.reason,
                message=exc.message,
            ),
            event_id=derived_id(view.job_id, view.attempt, "exited", replica),
        )
        await self.settle(key)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ------------------------------------------------------------------ watching and settling

    async def watch(self, rp: ReplicaProcess, view: JobView) -> None:
        key = (rp.job_id, rp.attempt)
        returncode = await rp.proc.wait()
        tail = await asyncio.to_thread(log_tail, rp.log_path)
        reason, exit_code, sig, message = classify_exit(
            returncode, tail, shell=isinstance(view.spec.command, str)
        )
        stop = self.stop_reasons.get(key)
        if reason is not None and stop == "timeout":
            reason, message = FailureReason.TIMEOUT, f"timed out after {view.spec.timeout:g}s and was stopped"
        await self.ledger.append(
            rp.job_id,
            JobReplicaExited(
                job_id=rp.job_id,
                attempt=rp.attempt,
                node=self.node,
                replica=rp.replica,
                exit_code=exit_code,
                signal=sig,
                reason=reason,
                message=message,
                log_tail=tail if reason else [],
            ),
            event_id=derived_id(rp.job_id, rp.attempt, "exited", rp.replica),
        )
        self.procs.get(key, {}).pop(rp.replica, None)
        if reason is not None and stop is None:
            self._spawn(self.stop_attempt(key, "peer_failed", self.settings.grace_seconds))
        await self.settle(key)

    async def settle(self, key: Key) -> None:
        """Decide how the attempt ended, once the replicas' exits say so."""
        job_id, attempt = key
        stop = self.stop_reasons.get(key)
        if self.procs.get(key):
            if stop in ("cancelled", "preempted"):
                return  # wait until every local replica is gone
        else:
            self.procs.pop(key, None)
            timer = self.timers.pop(key, None)
            if timer:
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
            if len({e.replica for e in view.exits}) == view.spec.replicas:
                return JobSucceeded(job_id=job_id, attempt=attempt)
            return None

        outcome = await self.ledger.record(
            job_id, decide, event_id=lambda v: derived_id(job_id, attempt, "ended")
        )
        if outcome.applied:
            log.info("job %s attempt %d: %s", job_id, attempt, outcome.event.type.rsplit(".", 1)[-1])

    async def finish(self, key: Key, data) -> None:
        await self.ledger.append(key[0], data, event_id=derived_id(key[0], key[1], "ended"))

    # ------------------------------------------------------------------ stopping

    async def cancel(self, job_id: str) -> None:
        view = await self.ledger.load(job_id)
        if view is None or not any(p.node == self.node for p in view.placements):
            return
        key = (job_id, view.attempt)
        if self.procs.get(key):
            await self.stop_attempt(key, "cancelled", self.settings.grace_seconds)
        elif view.state in (JobState.PLACED, JobState.RUNNING):
            await self.finish(key, JobCancelled(job_id=job_id, attempt=view.attempt, by="executor"))

    async def enforce_timeout(self, key: Key, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.stop_attempt(key, "timeout", self.settings.grace_seconds)

    async def stop_attempt(self, key: Key, reason: str, grace: float) -> None:
        procs = list(self.procs.get(key, {}).values())
        if not procs:
            return
        self.stop_reasons.setdefault(key, reason)
        log.info("stopping job %s attempt %d (%s), grace %.0fs", key[0], key[1], reason, grace)
        await asyncio.gather(*(terminate(rp.proc, grace) for rp in procs))

    async def shutdown(self) -> None:
        """Executor stopping: stop every local process (a restart requeues them as lost)."""
        everything = [rp.proc for procs in self.procs.values() for rp in procs.values()]
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*(terminate(p, min(self.settings.grace_seconds, 3)) for p in everything))


async def main(service: Service, settings: ExecutorSettings) -> None:
    executor = Executor(service, settings)
    service.spawn(executor.announce(), "heartbeat")
    try:
        await executor.reconcile()
        await service.bus.consume(
            f"executor-{settings.node_name}".replace(".", "-"),
            [
                "job.placed",
                "job.cancel_requested",
                "job.preempted",
                "job.cancelled",
                "job.failed",
                "job.succeeded",
                "job.requeued",
            ],
            executor.on_event,
            stream=EVENTS_STREAM.name,
            max_deliver=settings.max_deliver,
            concurrency=settings.event_concurrency,
        )
        await service.stopping.wait()
    finally:
        await executor.shutdown()
