"""The job ledger: the only way a service changes a job.

It brings the job's view up to date, lets the caller decide on it, checks the decision against the state
machine, appends it with the expected version (retrying on a concurrent write), and publishes it.
Publishing is guarded by an outbox: an event stored but not yet published (a crash in between, or no ack from
JetStream: the ledger does not wait for acks) is published by the relay later; JetStream drops a duplicate by
its Nats-Msg-Id.

Views are cached per job with the ids of the events folded into them; bringing one up to date reads only
the events stored after its version (usually none), so a write costs one small read, not a replay of the
job's whole history. The store's expected-version check keeps a stale cache from ever causing a wrong write.
An event seen on the bus is never folded in as such: the cache takes only what the store holds (`stored`),
so an event that was never recorded cannot change what a service believes.

Only jobs that can still change are cached: a job's view is forgotten once it is final (a later read of it
goes to the store), so the cache follows the live jobs, not every job the process has seen.

A compacted job (`EventStore.compact`, retention) keeps its first and last events; the events between them are
folded into its stored projection, which a read of the job starts from when the versions jump.

Writes to one job from one process take turns (`_Turns`): they never conflict with each other, however many
there are at once (a gang's replicas exiting together), so the bounded retries on a conflict are spent only on
writes from other processes; a decision that still cannot be stored raises ConcurrencyError to its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, derived_id, make_event
from gpuyard.shared.contracts.events.jobs import JobRequeued, RequeueReason
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, IllegalTransition, JobView, apply
from gpuyard.shared.stores.events import Append, ConcurrencyError, EventStore, Outage, Projection, StoreError

log = logging.getLogger(__name__)

Decide = Callable[[JobView | None], EventData | None]
MAX_CONFLICT_RETRIES = 8
CACHED_JOBS = 20_000
ENDED_JOBS = 512
"""Jobs that just ended whose views are kept apart (the least recently ended go first): a job's last events
often come from the bus after a read that already found them (its start, its exit and its end, read at once),
and each would otherwise cost a read of the job's whole stream."""


@dataclass(slots=True)
class Outcome:
    view: JobView | None  # the job after the call (unchanged if nothing was applied)
    event: CloudEvent | None = None  # the last event recorded (a `then` event when there was one)
    applied: bool = False
    duplicate: bool = False
    refused: IllegalTransition | None = None


@dataclass(slots=True)
class _Known:
    """A job's view at some version, and the ids of the events that made it."""

    view: JobView
    event_ids: set[str] = field(default_factory=set)

    @staticmethod
    def after(known: _Known | None, view: JobView, event_id: str) -> _Known:
        """What is known once `event_id` (which made `view`) is folded into `known`."""
        return _Known(view, {*known.event_ids, event_id} if known else {event_id})


@dataclass(slots=True)
class Decision:
    """What `record_many` asks about one job: `decide(view)` -> the event to record, or None.

    `then(view after that event)` may add its consequence (a replica's exit, then how the attempt ended):
    both are stored in one append, so the job never shows the one without the other."""

    job_id: str
    decide: Decide
    event_id: Callable[[JobView | None], str] | None = None
    then: Decide | None = None
    then_id: Callable[[JobView | None], str] | None = None


class _Turns:
    """One write at a time per job in this process, in the order they asked. A job is held only while a write
    to it is in flight: taking a free job's turn is a dict lookup and store (no await, no allocation); only a
    write that finds its job busy queues a future, and the holder hands the turn to the first one waiting."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, deque[asyncio.Future] | None] = {}
        """The jobs being written to, with the writes waiting for their turn (None: none waiting)."""

    def take(self, job_id: str) -> bool:
        """Take the job's turn if it is free; False: `wait` for it."""
        if job_id in self._held:
            return False
        self._held[job_id] = None
        return True

    async def wait(self, job_id: str) -> None:
        waiters = self._held[job_id]
        if waiters is None:
            waiters = self._held[job_id] = deque()
        turn = asyncio.get_running_loop().create_future()
        waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give(job_id)  # handed the turn as it was cancelled: pass it on
            raise  # (a cancelled turn left in the queue is skipped by `give`)

    def give(self, job_id: str) -> None:
        """The write is done: the next one waiting goes on, or the job is forgotten."""
        waiters = self._held[job_id]
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        del self._held[job_id]

    def __len__(self) -> int:
        return len(self._held)


def projection_of(view: JobView) -> Projection:
    return Projection(
        stream_id=view.job_id,
        tenant=view.tenant,
        state=view.state.value,
        created_at=view.created_at.isoformat(),
        version=view.version,
        doc=view,
        ended_at=(view.finished_at or view.updated_at).isoformat() if view.state.terminal else None,
    )


class JobLedger:
    def __init__(
        self,
        store: EventStore,
        bus: Bus | None,
        source: str,
        *,
        cached_jobs: int = CACHED_JOBS,
        ended_jobs: int = ENDED_JOBS,
        publishes: frozenset[Subject] | None = None,
    ):
        """`publishes`: the subjects this service may publish (`gpuyard.shared.bus.permissions`); its outbox relay
        leaves the others' events to their own services' relays. None: every subject."""
        self.store = store
        self.cached_jobs = cached_jobs
        """Most job views cached (the least recently used go first)."""
        self.bus = bus
        self.source = source
        self.publishes = publishes
        self._published: list[str] = []
        self._relay: asyncio.Task | None = None
        self.relay_outage = Outage(log, "outbox relay")
        """The relay's failures (the store's disk full, its lock held, the store or the bus away): said once
        until it relays again."""
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self.ended_jobs = ended_jobs
        self._ended: OrderedDict[str, _Known] = OrderedDict()
        """Final views, apart from the live ones: never in the way of a live job, and few."""
        self._turns = _Turns()

    async def load(self, job_id: str) -> JobView | None:
        known = await self._catch_up(job_id)
        return known.view if known else None

    async def events(self, job_id: str) -> list[CloudEvent]:
        return [s.event for s in await self.store.read_stream(job_id)]

    def _cached(self, job_id: str) -> _Known | None:
        return self._known.get(job_id) or self._ended.get(job_id)

    async def _catch_up(self, job_id: str) -> _Known | None:
        known = self._cached(job_id)
        newer = await self.store.read_stream(job_id, after_version=known.view.version if known else 0)
        if newer:
            view, ids = (known.view, set(known.event_ids)) if known else (None, set())
            for stored in newer:
                ids.add(stored.event.id)
                if stored.version != (view.version if view else 0) + 1:
                    view = await self._snapshot(job_id, stored.version)
                    if view.version >= stored.version:
                        continue  # the snapshot holds it
                view = apply(view, stored.event, version=stored.version)
            assert view is not None  # (`newer` is not empty: its first event set it)
            known = _Known(view, ids)
        if known is not None:
            self._remember(job_id, known)
        return known

    async def _snapshot(self, job_id: str, version: int) -> JobView:
        """The job's view folded up to at least `version` - 1, from its projection: a compacted stream's
        versions jump from its first event to its last, the events between folded into the projection."""
        doc = await self.store.get_projection(job_id)
        view = JobView.model_validate(doc) if doc is not None else None
        if view is None or view.version < version - 1:
            raise StoreError(
                f"job {job_id}: its events jump to version {version} and no projection covers them"
            )
        return view

    async def stored(self, event: CloudEvent, *, fresh: bool = False) -> JobView | None:
        """The job's view when `event` is one of the job's stored events, else None: every job event is stored
        before it is published, so one the store does not hold was never recorded (forged, or about a job or
        attempt that does not exist) and nothing may act on it. No read when this process already knows the
        event (it wrote or read it), unless `fresh`: then the view is brought up to date first."""
        job_id = getattr(event.data, "job_id", None)
        if not job_id or job_id != event.subject:
            return None
        known = self._cached(job_id)
        if fresh or known is None or event.id not in known.event_ids:
            known = await self._catch_up(job_id)
        return known.view if known is not None and event.id in known.event_ids else None

    def known(self, event: CloudEvent) -> JobView | None:
        """The cached view of the event's job when this process already knows the event (wrote or read it)."""
        return self.knows(event.subject or "", event.id)

    def knows(self, job_id: str, event_id: str) -> JobView | None:
        """`known` for an event given by its job's and its own id."""
        known = self._cached(job_id)
        return known.view if known is not None and event_id in known.event_ids else None

    def _remember(self, job_id: str, known: _Known) -> None:
        if known.view.state.terminal:
            self._known.pop(job_id, None)  # final: nothing more to decide on it; the store has it
            self._ended[job_id] = known  # (but its last events may still come from the bus)
            self._ended.move_to_end(job_id)
            while len(self._ended) > self.ended_jobs:
                self._ended.popitem(last=False)
            return
        self._known[job_id] = known
        self._known.move_to_end(job_id)
        while len(self._known) > self.cached_jobs:
            self._known.popitem(last=False)

    async def record(
        self,
        job_id: str,
        decide: Decide,
        *,
        event_id: Callable[[JobView | None], str] | None = None,
        then: Decide | None = None,
        then_id: Callable[[JobView | None], str] | None = None,
        cached: bool = False,
        new: bool = False,
    ) -> Outcome:
        """Apply what `decide(current view)` returns (None: nothing to do). Idempotent when `event_id` is
        deterministic: the same fact recorded twice is stored once.

        `cached=True` decides on the cached view without reading the store first, for a caller that keeps
        its cache current from the bus (`observe`) and whose `decide` may safely do nothing on a view that
        is a little behind: a write on a stale view is refused by the store and decided again.

        `new=True` is for a job whose id the caller has just made up: its first write reads nothing (there is
        nothing to read); should the job exist after all, the write is refused and decided again on it.

        Raises ConcurrencyError when writes from other processes kept getting there first
        (MAX_CONFLICT_RETRIES times): nothing was stored, and the caller tries again."""
        turns = self._turns
        if not turns.take(job_id):
            await turns.wait(job_id)
        try:
            [outcome] = await self._record_many(
                [Decision(job_id, decide, event_id, then, then_id)], cached=cached, new=new
            )
        finally:
            turns.give(job_id)
        return outcome

    async def record_many(
        self, decisions: list[Decision], *, cached: bool = False, new: bool = False
    ) -> list[Outcome]:
        """`record` for several jobs at once: their events go to the store in one transaction (where the
        store can) and are published together. A decision refused for a concurrent write is decided again
        on its own. It takes the jobs' turns in the order of their ids (so that two calls never wait for
        each other), and raises ConcurrencyError like `record` (then none of the outcomes is returned:
        deciding again is idempotent for what was stored)."""
        turns, taken = self._turns, []
        try:
            for job_id in sorted({d.job_id for d in decisions}):
                if not turns.take(job_id):
                    await turns.wait(job_id)
                taken.append(job_id)
            return await self._record_many(decisions, cached=cached, new=new)
        finally:
            for job_id in taken:
                turns.give(job_id)

    async def _record_many(self, decisions: list[Decision], *, cached: bool, new: bool) -> list[Outcome]:
        """`record_many` once the jobs' turns are taken."""
        conflict: ConcurrencyError | None = None
        outcomes: list[Outcome | None] = [None] * len(decisions)
        pending = list(range(len(decisions)))
        for round_ in range(MAX_CONFLICT_RETRIES):
            if not pending:
                break
            staged: list[tuple[int, _Known | None, JobView | None, list[CloudEvent], JobView]] = []
            for i in pending:
                d = decisions[i]
                known = self._cached(d.job_id) if cached and round_ == 0 else None
                if known is None and not (new and round_ == 0):
                    known = await self._catch_up(d.job_id)
                decided = self._stage(d, known)
                if isinstance(decided, Outcome):
                    outcomes[i] = decided
                else:
                    staged.append((i, known, *decided))
            pending, published = [], []
            results = (
                await self.store.append_many(
                    [
                        Append(decisions[i].job_id, view.version if view else 0, events, projection_of(after))
                        for i, _, view, events, after in staged
                    ]
                )
                if staged
                else []
            )
            for (i, known, view, events, after), result in zip(staged, results, strict=True):
                if isinstance(result, ConcurrencyError):
                    conflict = result
                    pending.append(i)  # someone wrote first: decide again on the newer view
                elif result.duplicate:
                    outcomes[i] = Outcome(view, events[-1], duplicate=True)
                else:
                    for event in events:
                        known = _Known.after(known, after, event.id)
                    assert known is not None  # (a staged append holds at least one event)
                    self._remember(decisions[i].job_id, known)
                    outcomes[i] = Outcome(after, events[-1], applied=True)
                    published.append((events, after.version - len(events) + 1, after.tenant))
            for events, first, tenant in published:
                await self._send(events, first, tenant)
        if pending:
            assert conflict is not None  # (a job stays pending only after a conflict)
            raise conflict  # another process kept writing to the job first: the caller tries again
        return [o for o in outcomes if o is not None]

    def _stage(
        self, d: Decision, known: _Known | None
    ) -> Outcome | tuple[JobView | None, list[CloudEvent], JobView]:
        """Decide on what is known: a final outcome, or (view, events, view after them) to store."""
        view = known.view if known else None
        data = d.decide(view)
        if data is None:
            return Outcome(view)
        event = make_event(data, source=self.source, id=d.event_id(view) if d.event_id else None)
        if known and event.id in known.event_ids:
            return Outcome(view, event, duplicate=True)  # this fact is already recorded
        try:
            new = apply(view, event)
        except IllegalTransition as exc:
            return self._refused(d.job_id, view, event, exc)
        events = [event]
        consequence = d.then(new) if d.then else None
        if consequence is not None:
            then = make_event(consequence, source=self.source, id=d.then_id(new) if d.then_id else None)
            try:
                new = apply(new, then)
                events.append(then)
            except IllegalTransition as exc:
                self._refused(d.job_id, new, then, exc)  # the fact itself is still recorded
        return view, events, new

    @staticmethod
    def _refused(job_id: str, view: JobView | None, event: CloudEvent, exc: IllegalTransition) -> Outcome:
        # expected and harmless (a late or repeated fact the state machine has gone past): a debug line, and
        # never the whole event, which may carry a spec's env
        log.debug("refused %s (id %s) for job %s: %s", event.type, event.id, job_id, exc)
        return Outcome(view, event, refused=exc)

    async def append(
        self,
        job_id: str,
        data: EventData,
        *,
        event_id: str | None = None,
        new: bool = False,
        cached: bool = False,
    ) -> Outcome:
        """Record one given event (no decision to make). `cached`, `new`: as for `record`."""
        return await self.record(
            job_id,
            lambda _view: data,
            event_id=(lambda _view: event_id) if event_id else None,
            new=new,
            cached=cached,
        )

    async def requeue_lost(
        self, job: JobView, message: str, *, not_before: datetime | None = None
    ) -> Outcome:
        """Requeue a placed or running attempt whose node or processes are gone, or that its node could not
        start (its disk full), as a new attempt (once, whoever notices first: the scheduler for a silent node,
        an executor for processes it lost or could not start). `not_before`: not placed again before then."""
        data = JobRequeued(
            job_id=job.job_id,
            attempt=job.attempt + 1,
            reason=RequeueReason.NODE_LOST,
            message=message,
            not_before=not_before,
        )
        return await self.record(
            job.job_id,
            lambda v: data if v and v.state in ACTIVE_STATES and v.attempt + 1 == data.attempt else None,
            event_id=lambda _v: derived_id(job.job_id, job.attempt, "requeued"),
        )

    async def _send(self, events: list[CloudEvent], first_version: int, tenant: str) -> None:
        """Publish a job's new events in version order without waiting for the server's acks: one that is
        never acknowledged stays unpublished in the store, and the outbox relay publishes it again. `tenant`
        (the job's, known from its view: no read) ends their subjects."""
        if self.bus is None:
            return
        for n, event in enumerate(events):
            try:
                ack = await self.bus.send(event, tenant=tenant, version=first_version + n)
            except Exception as exc:
                log.warning(
                    "publish of %s %s failed, left to the outbox relay: %s", event.type, event.id, exc
                )
                return  # the rest would overtake it: the relay publishes them in order
            ack.add_done_callback(functools.partial(self._acknowledged, event))

    def _acknowledged(self, event: CloudEvent, ack: asyncio.Future) -> None:
        error = TimeoutError("cancelled") if ack.cancelled() else ack.exception()
        if error is None:
            self._published.append(event.id)
        else:
            log.warning("publish of %s %s failed, left to the outbox relay: %s", event.type, event.id, error)

    # ------------------------------------------------------------------ outbox relay

    def start_relay(self, *, interval: float = 0.5, grace: float = 3.0) -> None:
        self._relay = asyncio.create_task(self._relay_loop(interval, grace), name="outbox-relay")

    async def _relay_loop(self, interval: float, grace: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.relay_once(grace=grace)

    async def relay_once(self, *, grace: float = 3.0) -> None:
        """One turn of the relay (`flush`). A failure is said once until a turn writes again (a full disk
        fails every turn until space is back), then that it resumed; a turn with nothing to write says
        neither."""
        marks = bool(self._published)
        try:
            relayed = await self.flush(grace=grace)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.relay_outage.failed(exc)
            return
        if marks or relayed:
            self.relay_outage.succeeded()

    async def flush(self, *, grace: float = 3.0) -> int:
        """Mark what was published, then publish what was stored but never published. What could not be
        marked is marked at the next flush."""
        done, self._published = self._published, []
        try:
            await self.store.mark_published(done)
        except BaseException:
            self._published[:0] = done
            raise
        if self.bus is None:
            return 0
        pending = await self.store.unpublished(older_than=grace)
        if self.publishes is not None:
            pending = [e for e in pending if e.nats_subject in self.publishes]
        tenants: dict[str, str] = {}
        done = []
        for event in pending:
            try:
                await self.bus.publish(event, tenant=await self._tenant(event, tenants))
            except ValueError as exc:  # no subject for it (a job without a valid tenant): never publishable
                log.error("outbox relay: %s %s cannot be published: %s", event.type, event.id, exc)
                continue
            done.append(event.id)
        await self.store.mark_published(done)
        return len(done)

    async def _tenant(self, event: CloudEvent, tenants: dict[str, str]) -> str | None:
        """The tenant of a stored event's job, for the relay: from the event itself (job.submitted), the cached
        view, or the job's stored projection (one read per job, only for events whose first publish failed)."""
        job_id = event.subject or ""
        tenant = getattr(event.data, "tenant", None) or tenants.get(job_id)
        if tenant is None:
            known = self._cached(job_id)
            if known is not None:
                tenant = known.view.tenant
            else:
                doc = await self.store.get_projection(job_id)
                tenant = doc["tenant"] if doc else None
            if tenant is not None:
                tenants[job_id] = tenant
        return tenant

    async def close(self) -> None:
        if self._relay is not None:
            self._relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relay
        with contextlib.suppress(Exception):
            await self.store.mark_published(self._published)
