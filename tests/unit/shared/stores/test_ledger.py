"""The job ledger: cached views stay correct across writers, and an event seen on the bus counts only when the
store holds it."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.shared.contracts.events.envelope import make_event, subject_of
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, fold
from gpuyard.shared.stores.events import ConcurrencyError, open_store
from gpuyard.shared.stores.ledger import MAX_CONFLICT_RETRIES, Decision, JobLedger

J = "job1"


@pytest.fixture
async def store(tmp_path):
    s = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    yield s
    await s.close()


def submitted():
    return JobSubmitted(job_id=J, name="n", tenant="t", user="u", spec=JobSpec(command="true"))


def placed(attempt=1):
    return JobPlaced(job_id=J, attempt=attempt, placements=[ReplicaPlacement(replica=0, node="n1")])


class CountingStore:
    """The store, counting the events read back (what the cache is there to avoid)."""

    def __init__(self, inner):
        self.inner, self.read, self.reads = inner, 0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def read_stream(self, stream_id, *, after_version=0):
        events = await self.inner.read_stream(stream_id, after_version=after_version)
        self.read += len(events)
        self.reads += 1
        return events


async def test_two_writers_never_overwrite_each_other_through_their_caches(store):
    a, b = JobLedger(store, None, "/a"), JobLedger(store, None, "/b")
    await a.append(J, submitted())
    assert (await b.load(J)).state == JobState.QUEUED  # b caches version 1
    await a.append(J, placed())  # a writes version 2; b's cache is now stale
    outcome = await b.record(J, lambda v: placed() if v.state == JobState.QUEUED else None)
    assert not outcome.applied and outcome.view.state == JobState.PLACED  # b caught up, then decided
    started = JobStarted(job_id=J, attempt=1, node="n1", replicas=[0])
    assert (await b.append(J, started)).applied
    stored = [s.event for s in await store.read_stream(J)]
    assert [e.type.rsplit(".", 1)[-1] for e in stored] == ["submitted", "placed", "started"]
    assert (await a.load(J)).model_dump() == fold(stored).model_dump()


async def test_a_cached_writer_reads_only_what_is_new(store):
    counting = CountingStore(store)
    ledger = JobLedger(counting, None, "/a")
    await ledger.append(J, submitted())
    await ledger.append(J, placed())
    await ledger.append(J, JobStarted(job_id=J, attempt=1, node="n1", replicas=[0]))
    assert counting.read == 0  # it wrote every event itself: nothing to read back
    assert (await ledger.load(J)).state == JobState.RUNNING


async def test_a_new_job_is_written_without_a_read_and_one_that_exists_after_all_is_decided_again(store):
    counting = CountingStore(store)
    ledger = JobLedger(counting, None, "/a")
    first = await ledger.append(J, submitted(), new=True)
    assert first.applied and counting.reads == 0

    other = "job2"
    await JobLedger(store, None, "/b").append(other, submitted().model_copy(update={"job_id": other}))
    again = await ledger.record(
        other, lambda v: submitted().model_copy(update={"job_id": other}) if v is None else None, new=True
    )
    assert not again.applied and again.view.state == JobState.QUEUED  # refused, read, decided again
    assert counting.reads == 1 and len(await store.read_stream(other)) == 1


async def test_the_same_fact_recorded_twice_is_stored_once(store):
    ledger = JobLedger(store, None, "/a")
    await ledger.append(J, submitted(), event_id="s1")
    again = await JobLedger(store, None, "/b").append(J, submitted(), event_id="s1")
    assert again.duplicate and not again.applied and again.refused is None
    assert len(await store.read_stream(J)) == 1


async def test_a_bus_event_the_store_does_not_hold_is_neither_known_nor_stored(store):
    """A bus event the store does not hold (forged) is neither known nor stored: the reader's view follows the
    store."""
    writer, reader = JobLedger(store, None, "/w"), JobLedger(store, None, "/r")
    await writer.append(J, submitted())
    await writer.append(J, placed())
    await reader.load(J)
    forged = make_event(JobStarted(job_id=J, attempt=1, node="elsewhere", replicas=[0]), source="/x")
    assert reader.known(forged) is None and await reader.stored(forged) is None
    real = await writer.append(J, JobStarted(job_id=J, attempt=1, node="n1", replicas=[0]))
    view = await reader.stored(real.event)
    assert view.state == JobState.RUNNING and view.version == 3
    assert view.model_dump() == (await writer.load(J)).model_dump()


async def test_stored_reads_only_for_an_event_this_process_does_not_know(store):
    counting = CountingStore(store)
    ledger = JobLedger(counting, None, "/w")
    own = await ledger.append(J, submitted())
    reads = counting.reads
    assert (await ledger.stored(own.event)).state == JobState.QUEUED and counting.reads == reads
    assert ledger.known(own.event).version == 1
    other = await JobLedger(store, None, "/o").append(J, placed())
    assert ledger.known(other.event) is None
    assert (await ledger.stored(other.event)).state == JobState.PLACED and counting.reads == reads + 1
    assert await ledger.stored(make_event(placed(), source="/x")) is None  # same job, an id never stored
    wrong_subject = other.event.model_copy(update={"subject": "another-job"})
    assert await ledger.stored(wrong_subject) is None  # the envelope names another job than its data


async def test_a_cached_decision_on_a_stale_view_is_refused_by_the_store_and_decided_again(store):
    a, b = JobLedger(store, None, "/a"), JobLedger(store, None, "/b")
    await a.append(J, submitted())
    await b.load(J)
    await a.append(J, placed())  # b's cache still says queued
    seen: list[str] = []

    def place_if_queued(view):
        seen.append(view.state)
        return placed() if view.state == JobState.QUEUED else None

    outcome = await b.record(J, place_if_queued, cached=True)
    assert seen == [JobState.QUEUED, JobState.PLACED]  # decided on the cache, refused, decided on the store
    assert not outcome.applied and len(await store.read_stream(J)) == 2


async def test_record_many_stores_several_jobs_and_decides_a_conflicting_one_again(store):
    a, b = JobLedger(store, None, "/a"), JobLedger(store, None, "/b")
    for job in ("j1", "j2", "j3"):
        await a.append(job, submitted().model_copy(update={"job_id": job}))
    await b.load("j2")
    await a.append("j2", placed().model_copy(update={"job_id": "j2"}))  # b's view of j2 is now stale
    calls: dict[str, int] = {}

    def place(job):
        def decide(view):
            calls[job] = calls.get(job, 0) + 1
            return placed().model_copy(update={"job_id": job}) if view.state == JobState.QUEUED else None

        return decide

    outcomes = await b.record_many([Decision(j, place(j)) for j in ("j1", "j2", "j3")], cached=True)
    assert [o.applied for o in outcomes] == [True, False, True]
    assert outcomes[1].view.state == JobState.PLACED  # refused by the store, decided again on the truth
    assert calls == {"j1": 1, "j2": 2, "j3": 1}
    for job in ("j1", "j2", "j3"):
        assert [s.event.type.rsplit(".", 1)[-1] for s in await store.read_stream(job)] == [
            "submitted",
            "placed",
        ]


class RecordingBus:
    """Acknowledges what is sent (or fails the acks, with `fail`); `publish` is what the outbox relay uses."""

    def __init__(self, fail: bool = False):
        self.sent = []
        self.relayed = []
        self.subjects = []  # the NATS subject of each event sent or relayed
        self.fail = fail

    async def send(self, event, *, tenant=None, version=None):
        self.subjects.append(subject_of(event, tenant))
        self.sent.append((event.type.rsplit(".", 1)[-1], version))
        ack = asyncio.get_running_loop().create_future()
        if self.fail:
            ack.set_exception(TimeoutError("no ack"))
        else:
            ack.set_result(None)
        return ack

    async def publish(self, event, *, tenant=None, version=None):
        self.subjects.append(subject_of(event, tenant))
        self.relayed.append(event.id)


async def test_events_whose_publish_is_not_acknowledged_are_published_again_by_the_relay(store):
    bus = RecordingBus(fail=True)
    ledger = JobLedger(store, bus, "/x")
    first = await ledger.append(J, submitted())
    await asyncio.sleep(0)  # the ack's callbacks run
    assert bus.sent == [("submitted", 1)]
    assert await ledger.flush(grace=0) == 1
    assert bus.relayed == [first.event.id]
    assert await store.unpublished(older_than=0) == []

    bus.fail = False
    second = await ledger.append(J, placed())
    await asyncio.sleep(0)
    assert await ledger.flush(grace=0) == 0  # acknowledged: marked published, nothing to relay
    assert bus.relayed == [first.event.id]
    assert second.event.id not in [e.id for e in await store.unpublished(older_than=0)]


async def test_job_events_are_sent_and_relayed_on_subjects_ending_with_their_jobs_tenant(store):
    """The ledger knows the job's tenant from the view it decides on (no read to send); a relay that never saw
    the job reads it from the job's projection."""
    bus = RecordingBus()
    ledger = JobLedger(store, bus, "/x")
    await ledger.append(J, submitted())
    await ledger.append(J, placed())
    await asyncio.sleep(0)  # the acks' callbacks run
    assert bus.subjects == ["job.submitted.t", "job.placed.t"]
    assert await ledger.flush(grace=0) == 0  # acknowledged

    writer = JobLedger(store, None, "/w")  # stored, never published
    await writer.append(
        "job2", JobSubmitted(job_id="job2", name="n", tenant="nlp", user="u", spec=JobSpec(command="true"))
    )
    await writer.append(
        "job2", JobPlaced(job_id="job2", attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])
    )
    relay_bus = RecordingBus()
    assert await JobLedger(store, relay_bus, "/relay").flush(grace=0) == 2
    assert relay_bus.subjects == ["job.submitted.nlp", "job.placed.nlp"]


async def test_a_fact_and_its_consequence_are_stored_in_one_append_and_published_in_order(store):
    from gpuyard.shared.contracts.events.jobs import JobReplicaExited, JobSucceeded

    bus = RecordingBus()
    ledger = JobLedger(store, bus, "/x")
    await ledger.append(J, submitted())
    await ledger.append(J, placed())
    await ledger.append(J, JobStarted(job_id=J, attempt=1, node="n1", replicas=[0]))
    exited = JobReplicaExited(job_id=J, attempt=1, node="n1", replica=0, exit_code=0)
    seen = []

    def then(view):
        seen.append(view.version)  # decided on the view after the exit
        return JobSucceeded(job_id=J, attempt=1) if view.exits else None

    outcome = await ledger.record(J, lambda _v: exited, then=then, then_id=lambda _v: "ended-1")
    assert outcome.applied and outcome.view.state == JobState.SUCCEEDED and outcome.view.version == 5
    assert seen == [4]
    stored = await store.read_stream(J)
    assert [(s.version, s.event.type.rsplit(".", 1)[-1]) for s in stored[3:]] == [
        (4, "replica_exited"),
        (5, "succeeded"),
    ]
    assert stored[4].event.id == "ended-1"
    assert bus.sent[3:] == [("replica_exited", 4), ("succeeded", 5)]


async def test_a_refused_consequence_leaves_the_fact_recorded(store):
    from gpuyard.shared.contracts.events.jobs import JobReplicaExited, JobSucceeded

    ledger = JobLedger(store, None, "/x")
    await ledger.append(J, submitted())
    await ledger.append(J, placed())  # placed, never started: succeeded is not a legal next state
    exited = JobReplicaExited(job_id=J, attempt=1, node="n1", replica=0, exit_code=0)
    outcome = await ledger.record(J, lambda _v: exited, then=lambda _v: JobSucceeded(job_id=J, attempt=1))
    assert outcome.applied and outcome.view.state == JobState.PLACED and outcome.view.version == 3
    assert [s.event.type.rsplit(".", 1)[-1] for s in await store.read_stream(J)][-1] == "replica_exited"


def gang(replicas: int) -> list:
    """A job of `replicas` replicas on one node, placed and started."""
    spec = JobSpec(command="true", replicas=replicas)
    return [
        JobSubmitted(job_id=J, name="n", tenant="t", user="u", spec=spec),
        JobPlaced(
            job_id=J, attempt=1, placements=[ReplicaPlacement(replica=r, node="n1") for r in range(replicas)]
        ),
        JobStarted(job_id=J, attempt=1, node="n1", replicas=list(range(replicas))),
    ]


@pytest.mark.parametrize("cached", [False, True])
async def test_concurrent_records_for_one_job_in_one_process_all_land(store, cached):
    """Twenty replicas exiting at once: every exit is stored, and the last one ends the attempt."""
    from gpuyard.shared.contracts.events.jobs import JobReplicaExited, JobSucceeded

    n = 20
    bus = RecordingBus()
    ledger = JobLedger(store, bus, "/x")
    for data in gang(n):
        await ledger.append(J, data)

    def then(view):
        return JobSucceeded(job_id=J, attempt=1) if len(view.exits) == n else None

    def exit_of(replica):
        exited = JobReplicaExited(job_id=J, attempt=1, node="n1", replica=replica, exit_code=0)
        return ledger.record(
            J,
            lambda _v: exited,
            event_id=lambda _v: f"exited-{replica}",
            then=then,
            then_id=lambda _v: "ended-1",
            cached=cached,
        )

    outcomes = await asyncio.gather(*(exit_of(r) for r in range(n)))
    assert all(o.applied for o in outcomes)
    stored = [s.event.type.rsplit(".", 1)[-1] for s in await store.read_stream(J)]
    assert stored[3:] == ["replica_exited"] * n + ["succeeded"]
    assert [v for _, v in bus.sent] == list(range(1, n + 5))  # published in version order
    assert len(ledger._turns) == 0  # no job is held once nothing is written


class GatedStore:
    """The store, holding every append until the test opens the gate (a write in flight, for as long as the
    test needs); with `conflicts`, it refuses that many appends as if another process had written first."""

    def __init__(self, inner, conflicts: int = 0):
        self.inner, self.conflicts = inner, conflicts
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0
        self.arrived = asyncio.Condition()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def in_flight(self, n: int) -> None:
        """Until `n` appends wait at the gate."""
        async with self.arrived:
            await self.arrived.wait_for(lambda: self.waiting >= n)

    async def append_many(self, appends):
        async with self.arrived:
            self.waiting += 1
            self.arrived.notify_all()
        await self.gate.wait()
        self.waiting -= 1
        if self.conflicts:
            self.conflicts -= 1
            return [
                ConcurrencyError(a.stream_id, a.expected_version, a.expected_version + 1) for a in appends
            ]
        return await self.inner.append_many(appends)


def exit_of(replica: int):
    return JobReplicaExited(job_id=J, attempt=1, node="n1", replica=replica, exit_code=0)


async def test_a_write_cancelled_while_waiting_for_its_turn_leaves_the_others_to_go_on(store):
    ledger = JobLedger(store, None, "/x")
    for data in gang(3):
        await ledger.append(J, data)
    ledger.store = gated = GatedStore(store)
    gated.gate.clear()
    first = asyncio.create_task(ledger.append(J, exit_of(0)))
    second = asyncio.create_task(ledger.append(J, exit_of(1)))
    third = asyncio.create_task(ledger.append(J, exit_of(2)))
    await gated.in_flight(1)
    assert gated.waiting == 1 and len(ledger._turns._held[J]) == 2  # the others wait for their turn
    second.cancel()
    gated.gate.set()
    assert (await first).applied and (await third).applied
    with pytest.raises(asyncio.CancelledError):
        await second
    assert [e.replica for e in (await ledger.load(J)).exits] == [0, 2]
    assert len(ledger._turns) == 0


async def test_a_write_that_other_processes_keep_beating_raises_and_frees_its_turn(store):
    ledger = JobLedger(store, None, "/x")
    for data in gang(1):
        await ledger.append(J, data)
    ledger.store = GatedStore(store, conflicts=MAX_CONFLICT_RETRIES)
    with pytest.raises(ConcurrencyError):
        await ledger.append(J, exit_of(0))  # nothing stored: the caller tries again
    assert len(ledger._turns) == 0 and (await ledger.load(J)).exits == []
    assert (await ledger.append(J, exit_of(0))).applied


async def test_record_many_and_record_take_turns_on_the_jobs_they_share(store):
    ledger = JobLedger(store, None, "/x")
    for data in gang(2):
        await ledger.append(J, data)
    for job in ("j0", "j2"):
        await ledger.append(job, submitted().model_copy(update={"job_id": job}))
    ledger.store = gated = GatedStore(store)
    gated.gate.clear()
    many = asyncio.create_task(
        ledger.record_many(
            [Decision(j, lambda _v, j=j: placed().model_copy(update={"job_id": j})) for j in ("j2", "j0")]
        )
    )
    one = asyncio.create_task(ledger.append(J, exit_of(0)))
    again = asyncio.create_task(ledger.append("j2", placed().model_copy(update={"job_id": "j2"})))
    await gated.in_flight(2)  # the batch and the exit of the other job
    assert len(ledger._turns._held["j2"]) == 1
    gated.gate.set()
    assert [o.applied for o in await many] == [True, True] and (await one).applied
    assert not (await again).applied  # decided after the batch, on its view: placed already
    assert len(ledger._turns) == 0


async def test_the_cache_holds_live_jobs_up_to_its_size_and_no_final_one(store):
    from gpuyard.shared.contracts.events.jobs import JobCancelled

    ledger = JobLedger(store, None, "/test", cached_jobs=10)
    for k in range(30):
        job = f"j{k}"
        data = JobSubmitted(job_id=job, name="n", tenant="t", user="u", spec=JobSpec(command="true"))
        await ledger.append(job, data, new=True)
        if k % 2:
            await ledger.append(job, JobCancelled(job_id=job, attempt=1, by="u"))
    cached = list(ledger._known)
    assert len(cached) <= 10 and cached[-3:] == ["j24", "j26", "j28"]  # the newest
    assert all(int(job[1:]) % 2 == 0 for job in cached)  # live ones only
    assert (await ledger.load("j1")).state == JobState.CANCELLED  # a final job is read from the store
    assert "j1" not in ledger._known


async def test_the_last_events_of_a_job_that_ended_cost_no_read_when_they_come_again(store):
    """A reader often finds a job's start, exit and end in one read (they are written together), then gets each
    of them from the bus: the job has ended and left the live cache, and its whole stream used to be read
    again for each. The few that ended last are kept apart, so those events are known without a read."""
    from gpuyard.shared.contracts.events.jobs import JobSucceeded

    writer, reader = JobLedger(store, None, "/executor"), JobLedger(store, None, "/scheduler", ended_jobs=2)
    counted = reader.store = CountingStore(store)
    jobs = [f"job{k}" for k in range(3)]
    ends = {}
    for job in jobs:
        spec = JobSpec(command="true")
        await writer.append(
            job, JobSubmitted(job_id=job, name="n", tenant="t", user="u", spec=spec), new=True
        )
        assert (await reader.load(job)).state == JobState.QUEUED  # (the scheduler reads the new job)
        place = JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")])
        await writer.append(job, place)
        await writer.append(job, JobStarted(job_id=job, attempt=1, node="n1", replicas=[0]))
        ends[job] = (await writer.append(job, JobSucceeded(job_id=job, attempt=1))).event
        assert (await reader.load(job)).state == JobState.SUCCEEDED  # placed, started, ended: one read
    reads = counted.reads
    for job in jobs[1:]:  # the two that ended last: known, with their final view
        assert reader.knows(job, ends[job].id).state == JobState.SUCCEEDED
        assert (await reader.stored(ends[job])).state == JobState.SUCCEEDED
        assert (await reader.load(job)).state == JobState.SUCCEEDED
    assert counted.reads - reads == 2  # the two loads, each of nothing newer
    assert counted.read == 3 * (1 + 3)  # every event read once: each submission, then the rest together
    assert reader.knows(jobs[0], ends[jobs[0]].id) is None  # beyond the bound: the store will say
    assert jobs[0] not in reader._known and list(reader._ended) == jobs[1:]
