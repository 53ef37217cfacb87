"""A model's replicas as the Models page and `models describe` read them: why a replica's last attempt ended
(a drain) is said while it waits to be placed again, and no longer once it is placed and serving."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobStarted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.stops import PreemptionCause
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
DRAINED = "drain: node vm is being drained"


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path, models=True, max_model_bytes=1 << 20) as c:
        yield c


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def record(ctx, job_id: str, *events) -> None:
    for data in events:
        asyncio.run(ctx.ledger.append(job_id, data))


def placed_and_started(job_id: str, attempt: int) -> tuple:
    where = ReplicaPlacement(replica=0, node="vm", gpus=[GpuShare(index=0, fraction=0.25)])
    return (
        JobPlaced(job_id=job_id, attempt=attempt, placements=[where], serving=True),
        JobStarted(job_id=job_id, attempt=attempt, node="vm", replicas=[0]),
    )


def replica(api) -> dict:
    [only] = api.get("/v1/models/mnist/deployments", headers=VISION).json()["replicas"]
    return only


def test_a_drained_replica_says_so_while_it_waits_and_not_once_it_serves_again(api, ctx):
    assert api.post("/v1/models", params={"name": "mnist"}, content=tiny_model(), headers=VISION).is_success
    deployed = api.post("/v1/models/mnist/deployments", json={"gpus": 0.25}, headers=VISION)
    job_id = deployed.json()["jobs"][0]["job_id"]
    record(ctx, job_id, *placed_and_started(job_id, 1))
    record(
        ctx,
        job_id,
        JobPreempted(job_id=job_id, attempt=1, cause=PreemptionCause.DRAIN, node="vm"),
        JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.PREEMPTED, message=DRAINED),
    )
    waiting = replica(api)
    assert (waiting["state"], waiting["message"]) == ("queued", DRAINED)

    record(ctx, job_id, *placed_and_started(job_id, 2))  # the node uncordoned: placed again, serving
    serving = replica(api)
    assert (serving["state"], serving["node"], serving["message"]) == ("running", "vm", "")
    attempts = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["attempts"]
    assert attempts[0]["message"] == DRAINED  # the ended attempt still says why it ended
