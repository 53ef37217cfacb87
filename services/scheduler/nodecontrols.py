"""What the leading scheduler does about nodes: a node silent for longer than `node_timeout` is lost and its jobs
are requeued; the jobs on a GPU marked unhealthy are requeued (`gpu_unhealthy`); those on a drained node or
GPU are preempted with a grace period. A node's controls (an admin's cordon, drain, uncordon; its unhealthy
GPUs) are read from the event store (`gpuyard.shared.stores.readmodels.nodecontrol`): they outlive any process,
and a `node.gpu_health` or `node.control` event says only which node's controls to read again.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from functools import cached_property

from gpuyard.services.scheduler.view import ClusterView
from gpuyard.shared.contracts.events.envelope import derived_id, make_event
from gpuyard.shared.contracts.events.jobs import JobPreempted, JobRequeued, RequeueReason
from gpuyard.shared.contracts.events.nodes import NodeLost
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobView
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.scheduling.preemption import lost_work
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.readmodels import nodecontrol
from gpuyard.shared.stores.readmodels.nodecontrol import NodeControl

log = logging.getLogger(__name__)


class NodeControls:
    """The nodes' controls as the scheduler holds them (in its view), and what the leader does about them."""

    def __init__(self, service, settings: SchedulerSettings, view: ClusterView) -> None:
        self.service = service  # (its event store, its bus: read when used)
        self.settings = settings
        self.view = view
        self.due: set[str] = set()  # nodes whose unhealthy or drained GPUs' jobs the leader looks at (`act`)

    @cached_property
    def ledger(self) -> JobLedger:
        """The service's job ledger, read on first use (the service has started by then)."""
        return self.service.ledger

    async def load(self) -> None:
        """Every node's cordons and unhealthy GPUs from the event store."""
        for control in (await nodecontrol.load_all(self.service.store)).values():
            self.view.control(control)
            self.due.add(control.node)

    async def read(self, node: str) -> None:
        """One node's controls read again from the event store (after an event that names it)."""
        control = await nodecontrol.read(self.service.store, node)
        self.view.control(control)
        self.due.add(node)
        log.info(
            "node %s: %s%s",
            node,
            "cordoned" if control.cordoned else "schedulable",
            "".join(f"; GPU {i}: {why}" for i, why in sorted(control.unhealthy.items())),
        )

    async def check_lost(self) -> None:
        """A node silent for longer than node_timeout leaves the inventory; its jobs are requeued."""
        for rec in self.view.lost_nodes(self.settings.node_timeout):
            name = rec.heartbeat.node
            log.warning("node %s lost: no heartbeat for %.0fs", name, time.time() - rec.last_seen)
            self.view.forget_node(name)
            lost = make_event(
                NodeLost(
                    node=name, last_seen=datetime.fromtimestamp(rec.last_seen, UTC), message="heartbeat lost"
                ),
                source=self.service.source,
                id=derived_id("node-lost", name, rec.last_seen),
            )
            await self.service.bus.publish(lost)
            for job in self.view.jobs_on(name):
                await self.requeue_lost(job, name)

    async def act(self) -> None:
        """The jobs on an unhealthy GPU are requeued (`gpu_unhealthy`); those on a drained node or GPU are
        preempted with a grace period (then requeued as preempted jobs are). Idempotent: each is decided once
        per attempt."""
        due, self.due = self.due, set()
        for name in sorted(due):
            control = self.view.controls.get(name)
            if control is None or not (
                control.draining or any(g.unhealthy or g.draining for g in control.gpus.values())
            ):
                continue  # (a cordon alone stops nothing that runs)
            await self.requeue_from_unhealthy(name, control)
            await self.preempt_from_drained(name, control)

    async def requeue_from_unhealthy(self, name: str, control: NodeControl) -> None:
        unhealthy = control.unhealthy
        for job in self.view.jobs_on_gpus(name, set(unhealthy)) if unhealthy else ():
            why = "; ".join(
                f"GPU {i} of node {name} is unhealthy: {unhealthy[i]}"
                for p in job.placements
                if p.node == name
                for i in sorted({g.index for g in p.gpus} & set(unhealthy))
            )
            await self.requeue_unhealthy(job, why)

    async def preempt_from_drained(self, name: str, control: NodeControl) -> None:
        if control.draining:
            drained = self.view.jobs_on(name)
        else:
            gpus = {i for i, g in control.gpus.items() if g.draining}
            drained = self.view.jobs_on_gpus(name, gpus) if gpus else []
        for job in drained:
            if job.job_id in self.view.jobs and job.preempt_requested is None:
                await self.preempt_drained(job, name)

    async def requeue_unhealthy(self, job: JobView, message: str) -> None:
        """As a lost node's jobs are requeued: a new attempt, and the executor stops what is left of the old
        one when it reads the requeue (SIGTERM, its grace period, then SIGKILL)."""
        data = JobRequeued(
            job_id=job.job_id, attempt=job.attempt + 1, reason=RequeueReason.GPU_UNHEALTHY, message=message
        )
        outcome = await self.ledger.record(
            job.job_id,
            lambda v: data if v and v.state in ACTIVE_STATES and v.attempt + 1 == data.attempt else None,
            event_id=lambda _v: derived_id(job.job_id, job.attempt, "requeued"),
        )
        if outcome.applied:
            log.warning("job %s requeued: %s", job.job_id, message)
        if outcome.view is not None:
            self.view.put_job(outcome.view)

    async def preempt_drained(self, job: JobView, node: str) -> None:
        lost = lost_work(self.view.allocation(job), time.time()) if job.started_at is not None else 0.0
        data = JobPreempted(
            job_id=job.job_id,
            attempt=job.attempt,
            cause=PreemptionCause.DRAIN,
            node=node,
            grace_seconds=self.settings.preemption_grace,
            lost_work_seconds=lost,
        )
        outcome = await self.ledger.record(
            job.job_id,
            lambda v: data if v and v.state in ACTIVE_STATES and v.attempt == data.attempt else None,
            event_id=lambda _v: derived_id(job.job_id, job.attempt, "preempted"),
        )
        if outcome.view is not None:
            self.view.put_job(outcome.view)

    async def requeue_lost(self, job: JobView, node: str) -> None:
        outcome = await self.ledger.requeue_lost(job, f"node {node} stopped sending heartbeats")
        if outcome.view is not None:
            self.view.put_job(outcome.view)
