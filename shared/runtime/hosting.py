"""The protocol of a host of attempts: a node's service that holds the replicas of the jobs placed on it (the
executor runs their processes, the serving service holds model sessions), written once for both.

- `job.placed` with replicas on this host's node: once the event store holds the placement (read fresh), and
  the job is this kind of host's (`hosts`), `on_placed`;
- `job.cancel_requested` of a job of this host's kind placed on its node, and `job.preempted` of an attempt
  that runs here: once the store holds it (read fresh), `on_stop_requested` (a `StopRequest`);
- the attempt's end (`job.succeeded`, `job.failed`, `job.cancelled`; `job.requeued` ends the attempt before
  its new one) for an attempt held here: once the store holds it, `on_attempt_ended`.

The bus is not the truth: an event the store does not hold was never recorded (forged, or about an attempt
that does not exist), changes nothing and is logged (`ignored`). Every step is idempotent: a redelivered event
finds the attempt taken on, stopping or released, and the host's records have deterministic ids.

A host's handlers are one `HandlerTable` (`handlers`): the protocol's, and the host's own besides
(`more_handlers`: the executor's idle warning and stop). `consume` wires them to the bus: placements from a
durable consumer the node's hosts of one kind share, the other events from a consumer of the host's own,
which passes over the ends of attempts it does not hold without decoding them (`concerns`)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from nats.aio.msg import Msg

from gpuyard.shared.bus.headers import concerns_holder, placed_for
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, Subject, subject_filter
from gpuyard.shared.contracts.jobstate import JobView
from gpuyard.shared.contracts.stops import StopReason
from gpuyard.shared.runtime.handlers import Handler, HandlerTable, Models
from gpuyard.shared.stores.ledger import JobLedger

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StopRequest:
    """Stop this host's replicas of an attempt: the job's cancel (`cancelled`, its current attempt, which may
    not have started here) or the attempt's preemption (`preempted`, with the preemption's grace)."""

    job_id: str
    attempt: int
    why: StopReason
    """One of `ASKED_STOPS`: the job's cancel, or the attempt's preemption."""
    view: JobView
    """The job as the event store has it now."""
    grace: float | None = None
    """Seconds between SIGTERM and SIGKILL the preemption gives; None: the host's own."""


class AttemptHost(ABC):
    """A host of the attempts placed on its node. A concrete host says which replicas and attempts are its
    (`places_here`, `hosts`, `holds`, `runs`, `holds_job`) and what it does (`on_placed`, `on_stop_requested`,
    `on_attempt_ended`); the protocol decides when."""

    ledger: JobLedger

    # ------------------------------------------------------------------ what a host says

    @abstractmethod
    def places_here(self, placements: Sequence[ReplicaPlacement]) -> bool:
        """Whether any of these replicas is this host's to run."""

    @abstractmethod
    def hosts(self, view: JobView) -> bool:
        """Whether the job's replicas are this kind of host's (a serve job's are the serving service's)."""

    @abstractmethod
    def holds(self, job_id: str, attempt: int) -> bool:
        """Whether this host holds the attempt: something of it to release at its end."""

    def runs(self, job_id: str, attempt: int) -> bool:
        """Whether something of the attempt runs here: something to stop (by default: whether it is held)."""
        return self.holds(job_id, attempt)

    @abstractmethod
    def holds_job(self, job_id: str) -> bool:
        """Whether this host holds an attempt of the job (told before an event is decoded: `concerns`)."""

    # ------------------------------------------------------------------ what a host does

    @abstractmethod
    async def on_placed(self, placed: JobPlaced, view: JobView) -> None:
        """Take on the placed attempt's replicas of this node (`view`: the job as the store has it now, which
        may have moved on since the placement)."""

    @abstractmethod
    async def on_stop_requested(self, stop: StopRequest) -> None:
        """Stop what runs of the attempt here, and record how it ended."""

    @abstractmethod
    async def on_attempt_ended(self, job_id: str, attempt: int) -> None:
        """The attempt's end is recorded (by anyone): stop what is left of it here, and release the rest."""

    def more_handlers(self) -> Mapping[Models, Handler]:
        """The host's own handlers besides the protocol's (none by default)."""
        return {}

    # ------------------------------------------------------------------ the protocol

    @cached_property
    def handlers(self) -> HandlerTable:
        """Every event the host acts on, to its handler (the bus's consumers, and tests, call it)."""
        return HandlerTable(
            {
                JobPlaced: self._placed,
                JobCancelRequested: self._cancel_requested,
                JobPreempted: self._preempted,
                (JobSucceeded, JobFailed, JobCancelled): self._ended,
                JobRequeued: self._requeued,
                **self.more_handlers(),
            }
        )

    async def _placed(self, data: JobPlaced, event: CloudEvent) -> None:
        if not self.places_here(data.placements):
            return
        view = await self.ledger.stored(event, fresh=True)  # (the read taking it on needs anyway)
        if view is None:
            return ignored(event)
        if self.hosts(view):
            await self.on_placed(data, view)

    async def _cancel_requested(self, data: JobCancelRequested, event: CloudEvent) -> None:
        view = await self.ledger.stored(event, fresh=True)
        if view is None:
            return ignored(event)
        if self.hosts(view) and self.places_here(view.placements):
            await self.on_stop_requested(StopRequest(data.job_id, view.attempt, StopReason.CANCELLED, view))

    async def _preempted(self, data: JobPreempted, event: CloudEvent) -> None:
        if not self.runs(data.job_id, data.attempt):  # (only the host that runs it reads the store)
            return
        view = await self.ledger.stored(event, fresh=True)
        if view is None:
            return ignored(event)
        await self.on_stop_requested(
            StopRequest(data.job_id, data.attempt, StopReason.PREEMPTED, view, data.grace_seconds)
        )

    async def _ended(self, data: JobSucceeded | JobFailed | JobCancelled, event: CloudEvent) -> None:
        await self._attempt_over(data.job_id, data.attempt, event)

    async def _requeued(self, data: JobRequeued, event: CloudEvent) -> None:
        await self._attempt_over(data.job_id, data.attempt - 1, event)  # (its attempt is the new one's)

    async def _attempt_over(self, job_id: str, attempt: int, event: CloudEvent) -> None:
        if not self.holds(job_id, attempt):
            return
        if await self.ledger.stored(event) is None:  # (no read when this host wrote it)
            return ignored(event)
        await self.on_attempt_ended(job_id, attempt)

    # ------------------------------------------------------------------ the bus

    def concerns(self, msg: Msg) -> bool:
        """Whether an event for the host's own consumer may concern it, told from its subject and headers
        before it is decoded: the stops and ends of attempts only when it holds one of the job's
        (`concerns_holder`)."""
        return concerns_holder(msg, self.holds_job)

    async def consume(
        self,
        bus,
        *,
        shared: str,
        own: str,
        holder: str,
        max_deliver: int,
        concurrency: int,
    ) -> None:
        """Wire `handlers` to the bus: placements from the durable consumer `shared` (the node's hosts of this
        kind share it; those of another holder are passed over undecoded), every other event from `own`."""
        placed = [subject_filter(Subject.JOB_PLACED)]
        others = [subject for subject in self.handlers.subject_filters() if subject not in placed]
        for durable, subjects, wanted in (
            (shared, placed, placed_for(holder)),
            (own, others, self.concerns),
        ):
            await bus.consume(
                durable,
                subjects,
                self.handlers,
                stream=EVENTS_STREAM.name,
                max_deliver=max_deliver,
                concurrency=concurrency,
                wanted=wanted,
            )


def ignored(event: CloudEvent) -> None:
    log.warning(
        "ignored %s %s about job %s: the event store does not hold it (forged, or about an attempt that "
        "does not exist)",
        event.type,
        event.id,
        event.subject,
    )
