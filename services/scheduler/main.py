"""Wiring of the scheduler service: follow job events and node heartbeats, run a cycle of the pure core
after every burst of events and on a timer, and record its decisions through the job ledger.

A node's heartbeats come twice: live, from a plain subscription (core NATS delivers a message to its
subscribers even when the telemetry stream cannot store it: its disk full, a stream that failed a write), and
from the stream, which also gives the last `node_timeout` of them again at start. A heartbeat is a newer-wins
fact: each node's newest, by the time it was sent, is taken once, and a copy or an older one changes nothing.
So a node whose heartbeats the stream refuses for longer than `node_timeout` is not declared lost.

Several replicas may run; one leads at a time (a lease in NATS KV, `gpuyard.shared.runtime.lease`). Every replica follows
the events (an ordered consumer each, not a shared durable: the next leader must not have missed any); only
the leader decides. A replica that becomes leader re-reads the live jobs from the event store first, and
every replica re-reads them every `resync_interval` as well, so a missed event can only delay a decision.
A job is never placed twice: the placement is recorded only while the stored job is queued for that attempt,
with an id derived from (job, attempt), through the store's expected-version check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg
from pydantic import ValidationError

from gpuyard.services.scheduler.heartbeats import heartbeat_problem
from gpuyard.services.scheduler.view import ClusterView, to_placement
from gpuyard.shared.bus.jetstream import entity_of, event_id_of
from gpuyard.shared.contracts.events.envelope import CloudEvent, derived_id, make_event
from gpuyard.shared.contracts.events.jobs import (
    JobPending,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    PendingReason,
    RequeueReason,
)
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.events.subjects import (
    EVENTS_STREAM,
    TELEMETRY_STREAM,
    Subject,
    job_subject,
    subject_filter,
)
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, LIVE_STATES, JobState, JobView, state_values
from gpuyard.shared.contracts.reasons import WAITING_ITS_TURN
from gpuyard.shared.runtime.lease import Lease
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.scheduling import CycleResult, Pending, Placement, SchedulerConfig, decide
from gpuyard.shared.scheduling.reasons import Reason
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import Decision, JobLedger
from gpuyard.shared.stores.readmodels import nodecontrol
from gpuyard.shared.stores.readmodels.queueline import LINE_KEY, LINE_MAX_JOBS, LINE_SECONDS, line_doc

log = logging.getLogger(__name__)
PENDING_REFRESH_SECONDS = 10.0  # a waiting job's changed estimated start is stored this often, at most
PENDING_WRITES_PER_CYCLE = 200  # the most reasons a cycle stores, and the most of the sweep it looks at
PENDING_SWEEP_PER_SECOND = 400  # the rest of a long line: reasons looked at per second, going round it
MIN_GATHER_SECONDS = 0.002
MAX_GATHER_SECONDS = 0.05
CYCLE_SHARE = 3
MAX_REFUSED_NODES = 1000  # nodes whose refused heartbeat is remembered (to say it once)
FOLLOWED = (  # the job events the scheduler reads from the bus
    Subject.JOB_SUBMITTED,
    Subject.JOB_STARTED,
    Subject.JOB_SUCCEEDED,
    Subject.JOB_FAILED,
    Subject.JOB_CANCEL_REQUESTED,
    Subject.JOB_CANCELLED,
    Subject.JOB_REQUEUED,
)
NOT_FOLLOWED = {  # and why it needs no others (a test checks that every job event is in one or the other)
    Subject.JOB_PLACED: "its own: it knows each one as it writes it",
    Subject.JOB_PENDING: "its own",
    Subject.JOB_PREEMPTED: "its own",
    Subject.JOB_REPLICA_EXITED: "an exit frees nothing until its attempt ends (succeeded, failed, requeued)",
}
"""A scheduler that starts leading reads every live job from the event store (`load`), and the periodic
`recheck` compares versions with the store: a follower misses nothing by not reading the leader's own events.
Not following them spares NATS their delivery and the scheduler their decoding: in a deep drain, more than
half of a job's events (its placement, the reasons it waits, its replicas' exits)."""

NODE_CONTROLS = (Subject.NODE_GPU_HEALTH, Subject.NODE_CONTROL)
"""The node events the scheduler follows (an unhealthy GPU, an admin's cordon, drain, uncordon): each says
only which node's controls to read again from the event store (`gpuyard.shared.stores.readmodels.nodecontrol`)."""
DRAIN_REASON = "drain"
"""`job.preempted`'s reason for the jobs of a drained node or GPU (requeued like preempted ones)."""

CHANGES_DECISIONS = {  # events after which a cycle may decide something new
    Subject.JOB_SUBMITTED,
    Subject.JOB_REQUEUED,
    Subject.JOB_SUCCEEDED,
    Subject.JOB_FAILED,
    Subject.JOB_CANCELLED,
    Subject.JOB_CANCEL_REQUESTED,
}


def gather_window(decide_seconds: float) -> float:
    """How long the next cycle waits for events to gather after the first one wakes it: a few milliseconds,
    or longer after a long decision (a long queue behind a full cluster), so that the scheduler spends at most
    about 1/(CYCLE_SHARE + 1) of its time deciding and each cycle places what several ended jobs freed. Only
    `decide` counts: it is the part a cycle costs whatever it places. Reading the jobs that changed and
    recording the placements cost the same however the events are gathered; counted in, they would space the
    cycles of a fast drain out for nothing (with 20,000 jobs queued: 100 ms apart instead of 40)."""
    return min(MAX_GATHER_SECONDS, max(MIN_GATHER_SECONDS, CYCLE_SHARE * decide_seconds))


def config_of(settings: SchedulerSettings) -> SchedulerConfig:
    return SchedulerConfig(
        policy=settings.policy,
        fair_share=settings.fair_share,
        tenant_weights=dict(settings.tenant_weights),
        user_gpu_cap=dict(settings.user_gpu_cap),
        borrowing=settings.borrowing,
        preemption=settings.preemption,
        min_runtime_before_preemption=settings.min_runtime_before_preemption,
        backfill=settings.backfill,
        reservation_depth=settings.reservation_depth,
    )


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


class SchedulerService:
    """The live scheduler: follows the events, leads or follows, runs `decide` on the held cluster and records
    what it decides."""

    def __init__(self, service: Service, settings: SchedulerSettings):
        self.service = service
        self.settings = settings
        self.ledger: JobLedger = service.ledger
        self.config = config_of(settings)
        self.view = ClusterView()
        self.dirty: set[str] = set()
        self.wake = asyncio.Event()
        self.leading = asyncio.Event()
        self.pending_sent: dict[str, Sent] = {}  # job -> its reason as stored last (`waiting`)
        self.line_stored_at = 0.0  # when the queue's line was looked at last (`store_line`)
        # ... and the hash of the line stored (None: not known, from before)
        self.line_stored: int | None = None
        self.gather_seconds = MIN_GATHER_SECONDS
        self.refused_nodes: dict[str, str] = {}  # node -> why its last heartbeat was ignored
        self.heard: dict[str, tuple[float, str]] = {}
        """Node → its newest heartbeat taken: when it was sent (no later than when it came) and its id. The
        other copy of it, or an older one, is not taken."""
        self.pending_cursor = 0  # where the next cycle looks at the reasons past the head of the line (`due`)
        self.swept_at = time.monotonic()  # ... and when it last moved
        self.controls_due: set[str] = set()  # nodes whose unhealthy or drained GPUs' jobs the leader looks at
        self.lease = Lease(
            service.bus,
            "scheduler",
            settings.instance,
            ttl=settings.lease_ttl,
            replicas=service.bus.replicas,
        )

    async def load(self) -> None:
        """Re-read the live jobs from the event store (a restarted or new leader forgets nothing)."""
        listed: set[str] = set()
        cursor = None
        while True:
            page = await self.service.store.list_projections(
                states=state_values(LIVE_STATES), limit=500, cursor=cursor
            )
            for doc in page.items:
                view = JobView.model_validate(doc)
                listed.add(view.job_id)
                self.view.put_job(view)
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        self.dirty |= set(self.view.jobs) - listed  # ended (or changed) since: the ledger will say
        await self.refresh_dirty()
        await self.load_controls()

    async def load_controls(self) -> None:
        """Every node's cordons and unhealthy GPUs from the event store (they outlive any process)."""
        for control in (await nodecontrol.load_all(self.service.store)).values():
            self.view.control(control)
            self.controls_due.add(control.node)

    async def on_node_control(self, event: CloudEvent, _msg=None) -> None:
        """A GPU marked unhealthy, or an admin's cordon, drain, uncordon: the node's controls are read again
        from the event store (an event it does not hold changes nothing)."""
        node = getattr(event.data, "node", None)
        if not node:
            return
        control = await nodecontrol.read(self.service.store, node)
        self.view.control(control)
        self.controls_due.add(node)
        log.info(
            "node %s: %s%s",
            node,
            "cordoned" if control.cordoned else "schedulable",
            "".join(f"; GPU {i}: {why}" for i, why in sorted(control.unhealthy.items())),
        )
        self.wake.set()

    async def resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval)
            await self.recheck()
            await self.load_controls()  # (a control the bus did not bring, a job placed as one arrived)
            self.wake.set()

    async def recheck(self) -> None:
        """Compare the version of every live job with the event store's and read again only the jobs that
        differ, are missing, or ended meanwhile: a missed event is repaired, and a resync with 20,000 jobs
        waiting decodes none of them."""
        stored = await self.service.store.versions(states=state_values(LIVE_STATES))
        held = self.view.jobs
        self.dirty.update(
            job_id for job_id, version in stored.items() if version != _version(held.get(job_id))
        )
        self.dirty.update(held.keys() - stored.keys())
        await self.refresh_dirty()

    async def gained(self) -> None:
        await self.load()
        log.info("leading; %d live jobs in the event store", len(self.view.jobs))
        self.pending_sent.clear()
        self.leading.set()
        self.wake.set()

    async def lost(self) -> None:
        self.leading.clear()

    async def on_job_event(self, event: CloudEvent | None, msg=None) -> None:
        """A job event from the bus says only which job to read again: the next cycle takes the job from the
        event store, so an event the store does not hold (forged, or about a job or attempt that does not
        exist) changes nothing. Its own writes it knows already (no read). The watch does not decode the
        events (`None`): their job, id and kind are in the message's headers and subject, and a message
        without them is decoded here."""
        if event is None:
            job_id, event_id, kind = entity_of(msg), event_id_of(msg), job_subject(msg.subject)
            if not (job_id and event_id and kind):
                try:
                    event = CloudEvent.from_json(msg.data)
                except ValueError:  # (pydantic's ValidationError is one)
                    return  # not an event: nothing to read again
        if event is not None:
            job_id, event_id, kind = event.subject or "", event.id, event.nats_subject
        view = self.ledger.knows(job_id, event_id)
        if view is None:
            self.dirty.add(job_id)  # the store will say
        else:
            self.view.put_job(view)
        if kind in CHANGES_DECISIONS:
            self.wake.set()  # the rest (started, exits, our own writes) waits for the timer's cycle

    async def on_live_heartbeat(self, msg: Msg) -> None:
        """A node's heartbeat as it is published (a plain subscription: `follow_heartbeats`)."""
        try:
            event = CloudEvent.from_json(msg.data)
        except (ValidationError, ValueError):
            return  # (not an event: nothing to learn)
        await self.on_heartbeat(event, msg)

    async def on_heartbeat(self, event: CloudEvent, _msg=None) -> None:
        """A node's heartbeat, live or from the stream; those of the last node_timeout are read again at start
        (`main`), each seen when it was sent, so that a scheduler that just started knows the nodes at once.
        Taken once: a heartbeat not newer than the node's newest taken (the other copy of it, an older one the
        stream delivers late) changes nothing."""
        if isinstance(event.data, NodeHeartbeat):
            sent = min(event.time.timestamp(), time.time())  # (a clock ahead of ours counts as now)
            newest = self.heard.get(event.data.node)
            if newest is not None and (event.id == newest[1] or sent < newest[0]):
                return
            problem = heartbeat_problem(event.data)
            if problem is not None:
                if self.refused_nodes.get(event.data.node) != problem:  # said once, not every 5 s
                    log.warning("node %s: heartbeat ignored: %s", event.data.node[:80], problem)
                if len(self.refused_nodes) >= MAX_REFUSED_NODES:
                    self.refused_nodes.clear()
                self.refused_nodes[event.data.node] = problem
                return
            self.refused_nodes.pop(event.data.node, None)
            self.heard[event.data.node] = (sent, event.id)
            if self.view.observe_node(event.data, now=sent):
                log.info("node %s: %d GPU(s)", event.data.node, len(event.data.gpus))
                self.wake.set()

    async def refresh_dirty(self) -> None:
        """Bring the jobs that events were seen for up to date (the ledger reads only their new events)."""
        dirty, self.dirty = self.dirty, set()
        for view in await asyncio.gather(*(self.ledger.load(job_id) for job_id in dirty)):
            if view is not None:
                self.view.put_job(view)

    async def run(self) -> None:
        """Cycle until the service stops (within one cycle_interval of SIGTERM)."""
        while not self.service.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.settings.cycle_interval)
            await asyncio.sleep(self.gather_seconds)  # a burst of events gathers: one cycle for all of them
            self.wake.clear()
            await self.cycle()

    async def cycle(self) -> None:
        """Bring the view up to date; the leader then decides, a follower keeps its view warm and decides
        nothing (and forgets, as the leader's cycle does, what left the queue)."""
        await self.refresh_dirty()
        if not self.leading.is_set():
            self.forget_left()
            self.view.waiting.prepare()
            return
        await self.check_nodes()
        await self.act_on_controls()
        await self.decide_and_record()

    def forget_left(self) -> None:
        """What is kept per waiting job goes once the job has left the queue (placed, cancelled, ended)."""
        for job_id in self.view.left_queue:
            self.pending_sent.pop(job_id, None)
        self.view.left_queue.clear()

    async def decide_and_record(self) -> None:
        """One cycle of the core on the held cluster, and its decisions recorded."""
        now = time.time()
        self.forget_left()
        queue = self.view.waiting
        queue.prepare()
        if not queue:
            self.gather_seconds = MIN_GATHER_SECONDS
            await self.store_line({}, now)
            return  # nothing waits: nothing to place, and preemption is only ever for a waiting job
        held = self.view.held
        began = time.perf_counter()
        index = held.index()
        result = decide(
            index, held.allocations(), queue, self.config, dict(self.settings.quotas), now, held.kinds
        )
        held.decided(result)
        self.gather_seconds = gather_window(time.perf_counter() - began)
        await self.apply(result, now)

    async def apply(self, result: CycleResult, now: float) -> None:
        """Record the cycle's decisions: placements first, then preemptions, then why jobs wait. Placements
        and reasons each go to the store in one transaction."""
        placed = [d for d in map(self.placed, result.placements) if d is not None]
        for outcome in await self.ledger.record_many(placed, cached=True):
            if outcome.view is not None:
                self.view.put_job(outcome.view)
                self.pending_sent.pop(outcome.view.job_id, None)
        for preemption in result.preemptions:
            job = self.view.jobs.get(preemption.job_id)
            if job is None or job.preempt_requested is not None:
                continue
            data = JobPreempted(
                job_id=job.job_id,
                attempt=job.attempt,
                reason=preemption.reason,
                by_job=preemption.by_job,
                grace_seconds=self.settings.preemption_grace,
            )
            await self.ledger.append(
                job.job_id, data, event_id=derived_id(job.job_id, job.attempt, "preempted")
            )
        waiting = []
        for job_id, reason in self.due(result.pending):
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
        await self.store_line(result.pending, now)

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
            placements=[to_placement(r, self._hb(r.node)) for r in placement.replicas],
            policy=self.config.policy,
            borrowed=placement.borrowed,
            serving=job.spec.serve is not None,
        )
        return Decision(
            job.job_id,
            lambda v: data if v and v.state == JobState.QUEUED and v.attempt == data.attempt else None,
            lambda v: derived_id(data.job_id, data.attempt, "placed"),
        )

    def waiting(self, job_id: str, reason, now: float) -> Decision | None:
        """Why a job waits, to store when it changed: its code or its sentence at once, its estimated start at
        most every PENDING_REFRESH_SECONDS. Its place in line alone is no change: the queue's line, stored
        once per turn, says it (`shared/stores/readmodels/queueline.py`); a long queue would otherwise rewrite every job as the
        head moves. A job that only waits its turn for busy resources gets its first reason once it has
        waited `pending_after` seconds: a burst of jobs placed within that time writes no reasons at all."""
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
        data = JobPending(
            job_id=job_id,
            attempt=job.attempt,
            reason=PendingReason(
                code=reason.code,
                message=reason.message,
                text=reason.text,
                details=dict(reason.details),
                position=reason.position,
                estimated_start=datetime.fromtimestamp(reason.estimated_start, UTC)
                if reason.estimated_start
                else None,
            ),
        )
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

    def _hb(self, node: str):
        rec = self.view.nodes.get(node)
        return rec.heartbeat if rec else None

    async def check_nodes(self) -> None:
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

    async def act_on_controls(self) -> None:
        """The jobs on an unhealthy GPU are requeued (`gpu_unhealthy`); those on a drained node or GPU are
        preempted with a grace period (then requeued as preempted jobs are). Idempotent: each is decided once
        per attempt."""
        due, self.controls_due = self.controls_due, set()
        for name in sorted(due):
            control = self.view.controls.get(name)
            if control is None or not (
                control.draining or any(g.unhealthy or g.draining for g in control.gpus.values())
            ):
                continue  # (a cordon alone stops nothing that runs)
            unhealthy = control.unhealthy
            for job in self.view.jobs_on_gpus(name, set(unhealthy)) if unhealthy else ():
                why = "; ".join(
                    f"GPU {i} of node {name} is unhealthy: {unhealthy[i]}"
                    for p in job.placements
                    if p.node == name
                    for i in sorted({g.index for g in p.gpus} & set(unhealthy))
                )
                await self.requeue_unhealthy(job, why)
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
        data = JobPreempted(
            job_id=job.job_id,
            attempt=job.attempt,
            reason=f"{DRAIN_REASON}: node {node} is being drained",
            grace_seconds=self.settings.preemption_grace,
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


async def follow_heartbeats(service: Service, scheduler: SchedulerService) -> None:
    """The nodes' heartbeats, live (core NATS: heard while the telemetry stream cannot store them) and from
    the stream (the last node_timeout of them again at start), both to `on_heartbeat`, which takes each once."""
    await service.bus.subscribe(Subject.NODE_HEARTBEAT.value, scheduler.on_live_heartbeat)
    await service.bus.watch(
        Subject.NODE_HEARTBEAT.value,
        scheduler.on_heartbeat,
        stream=TELEMETRY_STREAM.name,
        since=datetime.now(UTC) - timedelta(seconds=scheduler.settings.node_timeout),
        name="scheduler-heartbeats",  # (each watch's name in the bus figures of /metrics)
    )


async def main(service: Service, settings: SchedulerSettings) -> None:
    scheduler = SchedulerService(service, settings)
    await follow_heartbeats(service, scheduler)
    await service.bus.watch(
        [subject_filter(subject) for subject in FOLLOWED],
        scheduler.on_job_event,
        stream=EVENTS_STREAM.name,
        name="scheduler-jobs",
        decode=False,  # (it reads the jobs from the event store)
    )
    await service.bus.watch(
        [subject_filter(subject) for subject in NODE_CONTROLS],
        scheduler.on_node_control,
        stream=EVENTS_STREAM.name,
        name="scheduler-node-controls",
    )
    await scheduler.load()
    log.info("following job events (%d live jobs); leading once the lease is free", len(scheduler.view.jobs))
    await scheduler.lease.open()
    service.spawn(scheduler.lease.keep(scheduler.gained, scheduler.lost), "lease")
    service.spawn(scheduler.resync(), "resync")
    await scheduler.run()


def _version(job: JobView | None) -> int:
    return job.version if job is not None else 0
