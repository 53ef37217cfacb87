"""The protocol of a host of attempts (`gpuyard.shared.runtime.hosting`), the executor's and the serving
service's: which event reaches which of the host's steps, with which attempt, and only once the event store
holds the event. A recording host over a real embedded store and ledger; the events as the bus brings them."""

from __future__ import annotations

import logging
import uuid

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCancelRequested,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.runtime.hosting import AttemptHost, StopRequest
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger

NODE = "node-a"


class Recorder(AttemptHost):
    """Holds the attempts it is told to; records what the protocol asks of it."""

    def __init__(self, ledger: JobLedger):
        self.ledger = ledger
        self.held: set[tuple[str, int]] = set()
        self.calls: list[tuple] = []

    def places_here(self, placements) -> bool:
        return any(p.node == NODE for p in placements)

    def hosts(self, view) -> bool:
        return view.spec.serve is None

    def holds(self, job_id: str, attempt: int) -> bool:
        return (job_id, attempt) in self.held

    def holds_job(self, job_id: str) -> bool:
        return any(job == job_id for job, _ in self.held)

    async def on_placed(self, placed, view) -> None:
        self.calls.append(("placed", placed.attempt, view.attempt))

    async def on_stop_requested(self, stop: StopRequest) -> None:
        self.calls.append(("stop", stop.why, stop.attempt, stop.grace, stop.view.job_id))

    async def on_attempt_ended(self, job_id: str, attempt: int) -> None:
        self.calls.append(("ended", job_id, attempt))


@pytest.fixture
async def ledger(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    yield JobLedger(store, None, "/test")
    await store.close()


async def submitted(ledger: JobLedger) -> str:
    job_id = uuid.uuid4().hex
    spec = JobSpec.model_validate({"name": "unit", "command": "true"})
    await ledger.append(
        job_id, JobSubmitted(job_id=job_id, name="unit", tenant="team", user="ana", spec=spec)
    )
    return job_id


async def recorded(ledger: JobLedger, host: Recorder, data) -> None:
    """Store the event (as the service that decided it does), then deliver it as the bus would."""
    await ledger.append(data.job_id, data)
    event = [e for e in await ledger.events(data.job_id) if e.data == data][-1]
    await host.handlers(event)


def placed(job_id: str, node: str = NODE, attempt: int = 1) -> JobPlaced:
    return JobPlaced(job_id=job_id, attempt=attempt, placements=[ReplicaPlacement(replica=0, node=node)])


async def test_a_stored_placement_on_its_node_is_taken_on_and_a_forged_one_is_ignored(ledger, caplog):
    host = Recorder(ledger)
    job, elsewhere = await submitted(ledger), await submitted(ledger)
    forged = await submitted(ledger)
    with caplog.at_level(logging.WARNING, logger="gpuyard.shared.runtime.hosting"):
        await host.handlers(make_event(placed(forged), source="/forger"))
        await recorded(ledger, host, placed(elsewhere, node="node-b"))
        await recorded(ledger, host, placed(job))
    assert host.calls == [("placed", 1, 1)]  # (the forged one and the other node's: nothing)
    (warning,) = caplog.records
    assert f"about job {forged}: the event store does not hold it (forged" in warning.getMessage()


async def test_a_preemption_stops_only_an_attempt_that_runs_here_and_a_requeue_ends_the_attempt_before(
    ledger,
):
    host = Recorder(ledger)
    job = await submitted(ledger)
    await recorded(ledger, host, placed(job))
    await ledger.append(job, JobStarted(job_id=job, attempt=1, node=NODE, replicas=[0]))
    preempted = JobPreempted(job_id=job, attempt=1, cause=PreemptionCause.PRIORITY, grace_seconds=7)
    await recorded(ledger, host, preempted)  # not held here: passed over
    host.held.add((job, 1))
    await host.handlers([e for e in await ledger.events(job) if e.data == preempted][-1])  # redelivered
    requeued = JobRequeued(job_id=job, attempt=2, reason=RequeueReason.PREEMPTED, message="preempted")
    await recorded(ledger, host, requeued)
    assert host.calls[1:] == [("stop", "preempted", 1, 7, job), ("ended", job, 1)]


async def test_a_cancel_reaches_a_host_of_the_job_placed_here_with_its_current_attempt(ledger):
    host = Recorder(ledger)
    job, elsewhere = await submitted(ledger), await submitted(ledger)
    await recorded(ledger, host, placed(job))
    await recorded(ledger, host, placed(elsewhere, node="node-b"))
    await recorded(ledger, host, JobCancelRequested(job_id=elsewhere, by="ana"))
    await recorded(ledger, host, JobCancelRequested(job_id=job, by="ana"))
    assert host.calls == [("placed", 1, 1), ("stop", "cancelled", 1, None, job)]


async def test_placements_come_from_the_shared_consumer_and_the_rest_from_the_hosts_own():
    consumed = []

    class Bus:
        async def consume(self, durable, subjects, handler, **options):
            consumed.append((durable, subjects, handler, options["wanted"]))

    host = Recorder(None)
    await host.consume(Bus(), shared="node", own="node-0", holder="executor", max_deliver=5, concurrency=4)
    (shared, placements, table, wanted), (own, others, same, concerns) = consumed
    assert (shared, placements, own) == ("node", ["job.placed.*"], "node-0")
    assert sorted(others) == sorted(
        f"job.{kind}.*"
        for kind in ("succeeded", "failed", "cancel_requested", "cancelled", "preempted", "requeued")
    )
    assert table is same is host.handlers and concerns == host.concerns
