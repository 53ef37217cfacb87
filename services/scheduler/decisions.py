"""What a cycle decided, recorded through the job ledger: placements first, then preemptions, then why jobs
wait, and the queue's line.

A job is never placed twice: the placement is recorded only while the stored job is queued for that attempt,
with an id derived from (job, attempt), through the store's expected-version check. Placements and reasons
each go to the store in one transaction. A waiting job's reason is stored when it changed (its code or its
sentence at once, its estimated start at most every `PENDING_REFRESH_SECONDS`); a cycle looks at the reasons
of the jobs the core looked at one by one, and at the rest of a long line `PENDING_SWEEP_PER_SECOND` a second
in turn (`DecisionRecorder.due`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cached_property

from gpuyard.services.scheduler.view import ClusterView, to_placement
from gpuyard.shared.contracts.events.envelope import derived_id
from gpuyard.shared.contracts.events.jobs import JobPending, JobPlaced, JobPreempted, PendingReason
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.contracts.reasons import WAITING_ITS_TURN
from gpuyard.shared.scheduling.model import CycleResult, Placement, Preemption
from gpuyard.shared.scheduling.queue import Pending
from gpuyard.shared.scheduling.reasons import Reason
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import Decision, JobLedger
from gpuyard.shared.stores.readmodels.queueline import LINE_KEY, LINE_MAX_JOBS, LINE_SECONDS, line_doc

PENDING_REFRESH_SECONDS = 10.0  # a waiting job's changed estimated start is stored this often, at most
PENDING_WRITES_PER_CYCLE = 200  # the most reasons a cycle stores, and the most of the sweep it looks at
PENDING_SWEEP_PER_SECOND = 400  # the rest of a long line: reasons looked at per second, going round it

NO_LINE = hash(())  # the hash of an empty line (`store_line`)
Sent = tuple[str, str, float | None, float]
"""A job's reason as stored last: code, sentence (`Reason.text`), estimated start, when it was stored."""


def sent_of(pending: PendingReason, at: float) -> Sent:
    start = pending.estimated_start.timestamp() if pending.estimated_start else None
    return (pending.code, pending.text, start, at)


def same_estimate(before: float | None, now_estimate: float | None, now: float) -> bool:
    """Whether two estimated starts say the same: both unknown, or apart by less than a tenth of the wait
    left (at least a second)."""
    if before is None or now_estimate is None:
        return before is None and now_estimate is None
    return abs(before - now_estimate) < max(1.0, 0.1 * (now_estimate - now))


def in_line(pending: Mapping[str, Reason]) -> list[str]:
    """The ids of the jobs that have a place in line, in order (a plain mapping's: `Pending.line` otherwise)."""
    return [
        job_id for _, job_id in sorted((r.position, j) for j, r in pending.items() if r.position is not None)
    ]


def pending_reason(reason: Reason) -> PendingReason:
    return PendingReason(
        code=reason.code,
        message=reason.message,
        text=reason.text,
        details=dict(reason.details),
        position=reason.position,
        estimated_start=datetime.fromtimestamp(reason.estimated_start, UTC)
        if reason.estimated_start
        else None,
    )


class DecisionRecorder:
    """Records the leader's decisions through the job ledger, and remembers what it stored of each waiting
    job's reason (forgotten once the job leaves the queue: `forget_left`)."""

    def __init__(self, service, settings: SchedulerSettings, view: ClusterView, policy: Policy) -> None:
        self.service = service  # (its event store, for the queue's line: read when the line is stored)
        self.settings = settings
        self.view = view
        self.policy = policy
        self.pending_sent: dict[str, Sent] = {}  # job -> its reason as stored last (`waiting`)
        self.line_stored_at = 0.0  # when the queue's line was looked at last (`store_line`)
        # ... and the hash of the line stored (None: not known, from before)
        self.line_stored: int | None = None
        self.pending_cursor = 0  # where the next cycle looks at the reasons past the head of the line (`due`)
        self.swept_at = time.monotonic()  # ... and when it last moved

    @cached_property
    def ledger(self) -> JobLedger:
        """The service's job ledger, read on first use (the service has started by then)."""
        return self.service.ledger

    def forget_left(self) -> None:
        """What is kept per waiting job goes once the job has left the queue (placed, cancelled, ended)."""
        for job_id in self.view.left_queue:
            self.pending_sent.pop(job_id, None)
        self.view.left_queue.clear()

    async def apply(self, result: CycleResult, now: float) -> None:
        """Record the cycle's decisions: placements first, then preemptions, then why jobs wait."""
        await self.record_placements(result.placements)
        await self.record_preemptions(result.preemptions)
        await self.record_reasons(result.pending, now)
        await self.store_line(result.pending, now)

    async def record_placements(self, placements: Sequence[Placement]) -> None:
        placed = [d for d in map(self.placed, placements) if d is not None]
        for outcome in await self.ledger.record_many(placed, cached=True):
            if outcome.view is not None:
                self.view.put_job(outcome.view)
                self.pending_sent.pop(outcome.view.job_id, None)

    async def record_preemptions(self, preemptions: Sequence[Preemption]) -> None:
        for preemption in preemptions:
            job = self.view.jobs.get(preemption.job_id)
            if job is None or job.preempt_requested is not None:
                continue
            data = JobPreempted(
                job_id=job.job_id,
                attempt=job.attempt,
                cause=preemption.reason,
                by_job=preemption.by_job,
                grace_seconds=self.settings.preemption_grace,
                lost_work_seconds=preemption.lost_work_seconds,
            )
            await self.ledger.append(
                job.job_id, data, event_id=derived_id(job.job_id, job.attempt, "preempted")
            )

    async def record_reasons(self, pending: Mapping[str, Reason], now: float) -> None:
        """Why jobs wait, those that changed (at most `PENDING_WRITES_PER_CYCLE`), in one transaction."""
        waiting = []
        for job_id, reason in self.due(pending):
            decision = self.waiting(job_id, reason, now)
            if decision is not None:
                waiting.append(decision)
                if len(waiting) == PENDING_WRITES_PER_CYCLE:
                    break
        for outcome in await self.ledger.record_many(waiting, cached=True):
            if outcome.view is not None:
                self.view.put_job(outcome.view)
                if outcome.view.pending is not None:
                    self.pending_sent[outcome.view.job_id] = sent_of(outcome.view.pending, now)

    def due(self, pending: Mapping[str, Reason]) -> list[tuple[str, Reason]]:
        """The reasons a cycle looks at to store, in order of position: those of the jobs the core looked at one
        by one (its own work) every cycle, and of the rest of the line `PENDING_SWEEP_PER_SECOND` a second in
        turn (`pending_cursor` goes round it), so that a cycle never reads the reasons of the whole queue, and
        the many short cycles of a busy scheduler look at no more of them than a few long ones. The rest's
        reasons are their shapes' (a change of one reaches every job of the shape), and their places are the
        queue's line's: looked at once per turn, each is stored when it changed (`waiting`)."""
        if not isinstance(pending, Pending):  # (a plain mapping: every reason)
            return sorted(pending.items(), key=lambda item: item[1].position or 0)
        head = len(pending.known)
        out = pending.window(1, head)
        if len(pending) > head:
            if not head < self.pending_cursor <= len(pending):
                self.pending_cursor = head + 1
            now = time.monotonic()
            sweep = min(PENDING_WRITES_PER_CYCLE, int((now - self.swept_at) * PENDING_SWEEP_PER_SECOND))
            if sweep:
                self.swept_at = now
                last = self.pending_cursor + sweep - 1
                out += pending.window(self.pending_cursor, last)
                self.pending_cursor = last + 1
        return out

    def placed(self, placement: Placement) -> Decision | None:
        job = self.view.jobs.get(placement.job_id)
        if job is None:
            return None
        data = JobPlaced(
            job_id=job.job_id,
            attempt=job.attempt,
            placements=[to_placement(r, self.heartbeat_of(r.node)) for r in placement.replicas],
            policy=self.policy,
            borrowed=placement.borrowed,
            serving=job.spec.serve is not None,
        )
        return Decision(
            job.job_id,
            lambda v: data if v and v.state == JobState.QUEUED and v.attempt == data.attempt else None,
            lambda v: derived_id(data.job_id, data.attempt, "placed"),
        )

    def heartbeat_of(self, node: str) -> NodeHeartbeat | None:
        rec = self.view.nodes.get(node)
        return rec.heartbeat if rec else None

    def waiting(self, job_id: str, reason: Reason, now: float) -> Decision | None:
        """Why a job waits, to store when it changed: its code or its sentence at once, its estimated start at
        most every PENDING_REFRESH_SECONDS. Its place in line alone is no change: the queue's line, stored
        once per turn, says it (`shared/stores/readmodels/queueline.py`); a long queue would otherwise rewrite
        every job as the head moves. A job that only waits its turn for busy resources gets its first reason
        once it has waited `pending_after` seconds: a burst of jobs placed within that time writes no reasons
        at all."""
        sent = self.pending_sent.get(job_id)
        if (
            sent is None
            and reason.code in WAITING_ITS_TURN
            and now - self.view.queued_since.get(job_id, now) < self.settings.pending_after
            and (job := self.view.jobs.get(job_id)) is not None
            and job.pending is None
        ):  # (this runs for every waiting job on every cycle: cheapest tests first)
            return None  # it only waits its turn, not for long yet: a later cycle says why if it still waits
        job = self.view.jobs.get(job_id)
        if job is None:
            return None
        if sent is None and job.pending is not None:  # (stored before this scheduler led)
            sent = sent_of(job.pending, 0.0)
        if (
            sent is not None
            and sent[0] == reason.code
            and sent[1] == reason.text
            and (
                same_estimate(sent[2], reason.estimated_start, now) or now - sent[3] < PENDING_REFRESH_SECONDS
            )
        ):
            return None
        data = JobPending(job_id=job_id, attempt=job.attempt, reason=pending_reason(reason))
        return Decision(
            job_id, lambda v: data if v and v.state == JobState.QUEUED and v.attempt == data.attempt else None
        )

    async def store_line(self, pending: Mapping[str, Reason], now: float) -> None:
        """The queue's line (its first LINE_MAX_JOBS), every LINE_SECONDS while jobs wait and it changed, and
        once more when none is left."""
        if now - self.line_stored_at < LINE_SECONDS or (not pending and self.line_stored == NO_LINE):
            return
        self.line_stored_at = now
        jobs = (
            pending.line(LINE_MAX_JOBS) if isinstance(pending, Pending) else in_line(pending)[:LINE_MAX_JOBS]
        )
        stored = hash(tuple(jobs))  # (not the list: the scheduler keeps nothing in the depth of the queue)
        if stored != self.line_stored:
            await self.service.store.put_document(LINE_KEY, line_doc(jobs, datetime.fromtimestamp(now, UTC)))
            self.line_stored = stored
