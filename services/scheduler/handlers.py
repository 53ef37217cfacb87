"""What each event the scheduler follows does to it (`main.py` wires them to the bus through `HandlerTable`s).

A job event says only which job to read again: the next cycle takes the job from the event store, so an event
the store does not hold (forged, or about a job or attempt that does not exist) changes nothing. A node's
heartbeat is taken once, the newest of each node winning (`heartbeats.HeartbeatIntake`). A node control event
says only which node's controls to read again from the event store (`nodecontrols.py`).
"""

from __future__ import annotations

import time
from functools import cached_property

from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobCancelRequested,
    JobCheckpointed,
    JobFailed,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
)
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, NodeControlChanged, NodeHeartbeat
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.stores.ledger import JobLedger

FOLLOWED = (
    JobSubmitted,
    JobStarted,
    JobSucceeded,
    JobFailed,
    JobCancelRequested,
    JobCancelled,
    JobRequeued,
    JobCheckpointed,
)
"""The job events the scheduler reads from the bus. A running job's checkpoint moves where the work it would lose
by a preemption begins (`view.checkpointed_at`): the victims chosen are those that lose the least."""
NOT_FOLLOWED = {  # and why it needs no others (a test checks that every job event is in one or the other)
    Subject.JOB_PLACED: "its own: it knows each one as it writes it",
    Subject.JOB_PENDING: "its own",
    Subject.JOB_PREEMPTED: "its own",
    Subject.JOB_REPLICA_EXITED: "an exit frees nothing until its attempt ends (succeeded, failed, requeued)",
    Subject.JOB_EXEC_STARTED: "an audit record: it changes nothing the scheduler decides on",
}
"""A scheduler that starts leading reads every live job from the event store (`SchedulerService.load`), and
the periodic `recheck` compares versions with the store: a follower misses nothing by not reading the leader's
own events. Not following them spares NATS their delivery and the scheduler their decoding: in a deep drain,
more than half of a job's events (its placement, the reasons it waits, its replicas' exits)."""

NODE_CONTROL_EVENTS = (GpuHealthChanged, NodeControlChanged)
"""The node events the scheduler follows (an unhealthy GPU, an admin's cordon, drain, uncordon): each says
only which node's controls to read again from the event store (`gpuyard.shared.stores.readmodels.nodecontrol`)."""

CHANGES_DECISIONS = {  # events after which a cycle may decide something new
    Subject.JOB_SUBMITTED,
    Subject.JOB_REQUEUED,
    Subject.JOB_SUCCEEDED,
    Subject.JOB_FAILED,
    Subject.JOB_CANCELLED,
    Subject.JOB_CANCEL_REQUESTED,
}


class SchedulerHandlers:
    """The scheduler's handlers of the events it follows."""

    def __init__(self, scheduler: SchedulerService) -> None:
        self.scheduler = scheduler  # (its `dirty`, a new set every cycle, is read from it each time)
        self.view, self.wake = scheduler.view, scheduler.wake

    @cached_property
    def ledger(self) -> JobLedger:
        """The scheduler's job ledger, read once, at the first job event (its service has started by then)."""
        return self.scheduler.ledger

    def job_changed(self, job_id: str, event_id: str, kind: Subject) -> None:
        """Event `event_id` (of `kind`) of job `job_id` came: its own writes the ledger knows already (no
        read); any other job is read again from the event store by the next cycle. Only the events that may
        change a decision wake a cycle: the rest (started, checkpointed, our own writes) waits for the next one."""
        view = self.ledger.knows(job_id, event_id)
        if view is None:
            self.scheduler.dirty.add(job_id)  # the store will say
        else:
            self.view.put_job(view)
        if kind in CHANGES_DECISIONS:
            self.wake.set()

    async def on_job_event(self, _data: EventData, event: CloudEvent) -> None:
        """A job event of `FOLLOWED`, decoded (one whose message did not name its job and id:
        `main.job_messages`)."""
        self.job_changed(event.subject or "", event.id, event.nats_subject)

    async def on_heartbeat(self, data: NodeHeartbeat, event: CloudEvent) -> None:
        """A node's heartbeat, live or from the stream; those of the last node_timeout are read again at start
        (`main.follow_heartbeats`), each seen when it was sent, so that a scheduler that just started knows
        the nodes at once."""
        sent = min(event.time.timestamp(), time.time())  # (a clock ahead of ours counts as now)
        if self.scheduler.heartbeats.take(data, event.id, sent):
            self.wake.set()

    async def on_node_control(self, data: GpuHealthChanged | NodeControlChanged, _event: CloudEvent) -> None:
        """A GPU marked unhealthy, or an admin's cordon, drain, uncordon: the node's controls are read again
        from the event store (an event it does not hold changes nothing)."""
        if not data.node:
            return
        await self.scheduler.node_controls.read(data.node)
        self.wake.set()
