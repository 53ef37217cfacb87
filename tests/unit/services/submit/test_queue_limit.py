"""A tenant with as many jobs waiting as its limit gets 429 with a reason and an honest Retry-After, on the
fast path and the route alike; the count follows the store's (placed, cancelled, requeued jobs)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.queuedepth import RETRY_AFTER_UNKNOWN, QueueDepth, QueueFull
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCancelled,
    JobPlaced,
    JobRequeued,
    JobSubmitted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.ledger import JobLedger
from tests.unit.services.submit.submitctx import submit_app, submit_context

TOKENS = Tokens(None, "tok-vision=vision:ana,tok-nlp=nlp:bo")
SPEC = {"command": "true", "resources": {"gpus": 1}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def submitted(job_id: str, tenant: str = "vision"):
    data = JobSubmitted(job_id=job_id, name=job_id, tenant=tenant, user="ana", spec=JobSpec(command="true"))
    return make_event(data, source="/test")


def placed(job_id: str):
    return make_event(
        JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n")]), source="/t"
    )


def requeued(job_id: str):
    return make_event(JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST), source="/t")


def cancelled(job_id: str):
    return make_event(JobCancelled(job_id=job_id, attempt=1, by="ana"), source="/t")


@pytest.fixture(params=[True, False], ids=["fast path", "route"])
def service(request, tmp_path):
    with (
        submit_context(tmp_path, TOKENS, queue=QueueDepth(limit=2, per_tenant={"nlp": 3})) as ctx,
        TestClient(submit_app(ctx, request.param)) as client,
    ):
        yield client, ctx


def post(client, token="tok-vision", key=None):
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return client.post(
        "/v1/jobs", content=json.dumps(SPEC), headers=headers | ({"Idempotency-Key": key} if key else {})
    )


def test_a_tenant_at_its_limit_gets_429_with_a_reason_and_retry_after(service):
    client, ctx = service
    assert [post(client, key=f"k{i}").status_code for i in range(2)] == [202, 202]
    refused = post(client)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == str(RETRY_AFTER_UNKNOWN)
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["detail"].startswith("tenant 'vision' has 2 jobs queued, its limit is 2")
    assert len(client.get("/v1/jobs", headers={"Authorization": "Bearer tok-vision"}).json()["items"]) == 2
    # another tenant is not held back, and its own limit applies
    assert [post(client, "tok-nlp").status_code for _ in range(4)] == [202, 202, 202, 429]
    # a retry of a job already queued is answered, not refused
    again = post(client, key="k0")
    assert again.status_code == 202 and again.json()["duplicate"]


def count(ctx: SubmitContext) -> None:
    """The store's count, as the submit service takes it every second."""
    asyncio.run(ctx.queue.refresh(ctx.store))


def record(ctx: SubmitContext, event) -> None:
    """Another service's write of a job event (the scheduler's placement, a cancel)."""
    asyncio.run(JobLedger(ctx.store, None, "/other").append(event.subject, event.data))


def test_a_job_that_leaves_the_queue_makes_room(service):
    client, ctx = service
    ids = [post(client).json()["job_id"] for _ in range(2)]
    assert post(client).status_code == 429
    record(ctx, placed(ids[0]))
    assert post(client).status_code == 429  # (not counted yet: the count errs on the side of refusing)
    count(ctx)
    assert post(client).status_code == 202
    assert post(client).status_code == 429
    record(ctx, requeued(ids[0]))  # back in the queue: counts again
    record(ctx, cancelled(ids[1]))
    count(ctx)
    assert ctx.queue.queued("vision") == 2
    assert post(client).status_code == 429


def test_a_retry_of_a_job_no_longer_queued_is_answered_when_the_queue_is_full(service):
    client, ctx = service
    first = post(client, key="old").json()
    record(ctx, cancelled(first["job_id"]))
    count(ctx)
    assert [post(client).status_code for _ in range(3)] == [202, 202, 429]
    again = post(client, key="old")
    assert again.status_code == 202 and again.json()["job_id"] == first["job_id"]


class Counts:
    """A store whose count is set by the test."""

    def __init__(self) -> None:
        self.queued: dict[str, int] = {}
        self.during = None  # called while the count runs

    async def count_by_tenant(self, *, states):
        counted = dict(self.queued)
        if self.during:
            self.during()
        return counted


def test_retry_after_is_the_time_the_queue_needs_at_its_drain_rate():
    clock, store = Clock(), Counts()
    depth = QueueDepth(limit=10, clock=clock)
    store.queued = {"vision": 40}
    asyncio.run(depth.refresh(store))
    for left in range(30):  # 30 placed over the last minute: 0.5 a second
        clock.now += 2
        store.queued = {"vision": 40 - left - 1}
        asyncio.run(depth.refresh(store))
    store.queued = {"vision": 10}
    asyncio.run(depth.refresh(store))
    with pytest.raises(QueueFull) as refused:
        depth.admit("vision", "new")
    assert refused.value.queued == 10 and refused.value.retry_after == 2  # (10 - 10 + 1) / 0.5
    store.queued = {"vision": 30}  # 20 more queued through another replica: no departure
    asyncio.run(depth.refresh(store))
    assert depth.full("vision").retry_after == 42  # (30 - 10 + 1) / 0.5
    clock.now += 120  # nothing placed for two minutes: no rate known
    assert depth.full("vision").retry_after == RETRY_AFTER_UNKNOWN


def test_this_replicas_own_submissions_are_not_taken_for_departures():
    clock, store = Clock(), Counts()
    depth = QueueDepth(limit=100, clock=clock)
    asyncio.run(depth.refresh(store))
    for i in range(5):
        depth.admit("vision", f"j{i}")
        depth.stored(f"j{i}")
    clock.now += 1
    store.queued = {"vision": 3}  # five arrived, two left
    asyncio.run(depth.refresh(store))
    assert depth.queued("vision") == 3
    assert depth.drains["vision"].rate(clock.now) == 2 / 60


def test_a_reservation_counts_until_a_count_that_began_after_it_was_stored():
    clock, store = Clock(), Counts()
    depth = QueueDepth(limit=5, clock=clock)
    assert depth.admit("vision", "early") and depth.admit("vision", "late")
    assert not depth.admit("vision", "early")  # already reserved
    depth.stored("early")
    clock.now += 1
    store.queued = {"vision": 1}  # the count sees "early"

    def while_counting():
        clock.now += 1
        depth.stored("late")  # stored while the store counts: maybe in the count, maybe not

    store.during = while_counting
    asyncio.run(depth.refresh(store))
    assert depth.queued("vision") == 2  # "early" once; "late" on top, whatever the count saw
    store.during, store.queued = None, {"vision": 2}
    clock.now += 1
    asyncio.run(depth.refresh(store))
    assert depth.queued("vision") == 2 and not depth.reserved
    assert depth.admit("vision", "lost")
    depth.release("lost")  # never stored
    assert depth.queued("vision") == 2


def test_no_limit_counts_nothing():
    depth = QueueDepth(limit=0, per_tenant={"nlp": 3})
    assert depth.limited
    assert not any(depth.admit("vision", f"j{i}") for i in range(100))  # no limit applies: nothing reserved
    assert [depth.admit("nlp", f"n{i}") for i in range(3)] == [True] * 3
    with pytest.raises(QueueFull):
        depth.admit("nlp", "n3")
    assert not QueueDepth(limit=0).limited
