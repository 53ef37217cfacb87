"""A tenant with as many jobs waiting as its limit gets 429 with a reason and an honest Retry-After, on the
fast path and the route alike; the count follows the job events (placed, cancelled, requeued)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from services.submit.app import create_app
from services.submit.context import SubmitContext
from services.submit.fastpath import FastSubmit
from services.submit.queuedepth import RETRY_AFTER_UNKNOWN, QueueDepth, QueueFull
from shared.events import (
    JobCancelled,
    JobPlaced,
    JobRequeued,
    JobSubmitted,
    ReplicaPlacement,
    RequeueReason,
    make_event,
)
from shared.jobspec import JobSpec
from shared.ledger import JobLedger
from shared.logstore import open_log_store
from shared.store import open_store
from shared.tokens import Tokens

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
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    logs = asyncio.run(open_log_store(f"sqlite:///{tmp_path / 'logs.db'}"))
    ctx = SubmitContext(
        store=store,
        ledger=JobLedger(store, None, "/test"),
        tokens=TOKENS,
        logs=logs,
        queue=QueueDepth(limit=2, per_tenant={"nlp": 3}),
    )
    app = create_app(ctx)
    if not request.param:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not FastSubmit]
    with TestClient(app) as client:
        yield client, ctx
    asyncio.run(store.close())
    asyncio.run(logs.close())


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


def test_a_job_that_leaves_the_queue_makes_room(service):
    client, ctx = service
    ids = [post(client).json()["job_id"] for _ in range(2)]
    assert post(client).status_code == 429
    ctx.queue.observe(placed(ids[0]))
    assert post(client).status_code == 202
    assert post(client).status_code == 429
    ctx.queue.observe(requeued(ids[0]))  # back in the queue: counts again
    ctx.queue.observe(cancelled(ids[1]))
    assert post(client).status_code == 429


def test_a_retry_of_a_job_no_longer_queued_is_answered_when_the_queue_is_full(service):
    client, ctx = service
    first = post(client, key="old").json()
    ctx.queue.observe(placed(first["job_id"]))
    ctx.queue.observe(make_event(cancelled(first["job_id"]).data, source="/t"))
    ctx.queue.active.pop(first["job_id"], None)  # as if it had ended and been forgotten
    assert [post(client).status_code for _ in range(3)] == [202, 202, 429]
    again = post(client, key="old")
    assert again.status_code == 202 and again.json()["job_id"] == first["job_id"]


def test_retry_after_is_the_time_the_queue_needs_at_its_drain_rate():
    clock = Clock()
    depth = QueueDepth(limit=10, clock=clock)
    for i in range(40):
        depth.observe(submitted(f"j{i}"))
    for i in range(30):  # 30 placed over the last minute: 0.5 a second
        clock.now += 2
        depth.observe(placed(f"j{i}"))
    with pytest.raises(QueueFull) as refused:
        depth.admit("vision", "new")
    assert refused.value.queued == 10 and refused.value.retry_after == 2  # (10 - 10 + 1) / 0.5
    for i in range(40, 60):
        depth.observe(submitted(f"j{i}"))
    assert depth.full("vision").retry_after == 42  # (30 - 10 + 1) / 0.5
    clock.now += 120  # nothing placed for two minutes: no rate known
    assert depth.full("vision").retry_after == RETRY_AFTER_UNKNOWN


def test_no_limit_and_reservations_released():
    depth = QueueDepth(limit=0)
    for i in range(100):
        assert depth.admit("vision", f"j{i}")
    assert not depth.admit("vision", "j0")  # already counted
    depth.release("j0")
    assert depth.counts["vision"] == 99


def test_events_seen_while_the_store_is_read_win_over_it(tmp_path):
    async def scenario():
        store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
        ledger = JobLedger(store, None, "/test")
        for i in range(3):
            await ledger.append(f"j{i}", submitted(f"j{i}").data)
        await ledger.append("j2", placed("j2").data)
        depth = QueueDepth(limit=5)
        real = store.list_projections

        async def listing(**kw):
            page = await real(**kw)
            depth.observe(placed("j0"))  # arrives while the store is read: newer than the page
            depth.admit("vision", "j9")
            return page

        store.list_projections = listing
        await depth.load(store)
        await store.close()
        return depth

    depth = asyncio.run(scenario())
    assert depth.queued == {"j1": "vision", "j9": "vision"} and set(depth.active) == {"j2"}
    assert depth.counts["vision"] == 2


def test_the_openapi_document_names_429_and_its_retry_after(service):
    client, _ = service
    operation = client.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]
    answer = operation["responses"]["429"]
    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    assert answer["headers"]["Retry-After"]["schema"] == {"type": "integer"}
