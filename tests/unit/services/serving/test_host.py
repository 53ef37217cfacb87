"""The serving service's host of serve jobs (`services/serving/host.py`) over a real event store and model
store: a placement loads the version (checksum checked) and records `job.started` then `model.ready`; a broken
artifact fails the job at once with its reason while the versions already ready keep serving; cancel, preemption
and an end seen on the bus release the session; a restart loads again what runs here, recording nothing twice."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from gpuyard.services.serving.held import model_key
from gpuyard.services.serving.host import CHECKSUM_MISMATCH, INVALID_MODEL
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    GpuShare,
    JobCancelRequested,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.models import ModelFailed, ModelReady
from gpuyard.shared.contracts.stops import AttemptOutcome, PreemptionCause, preemption_text

from .hostharness import ENDPOINT, NODE, CountingLoader, HostHarness
from .models import Mlp, unloadable

KEY = model_key("vision", "mnist")
MLP = Mlp(seed=3)


@pytest.fixture
async def h(tmp_path):
    harness = await HostHarness(tmp_path).open()
    yield harness
    await harness.close()


def damage(path: str) -> None:
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(40)
        f.write(b"\x00\x01\x02")


async def test_a_placement_loads_the_version_then_records_started_and_announces_ready(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    placed = await h.place(host, job, gpu=1)
    view = await h.wait(job, "running")
    assert view.current.notes == ["model mnist:1 served on CPUExecutionProvider"]
    [ready] = h.bus.of(ModelReady)
    assert (ready.name, ready.tenant, ready.version, ready.job_id) == ("mnist", "vision", 1, job)
    assert (ready.node, ready.endpoint, ready.provider, ready.device) == (
        NODE,
        ENDPOINT,
        "CPUExecutionProvider",
        None,
    )
    assert h.loader.calls[0]["gpu"] == 1  # the placement's GPU, used when CUDA is there
    entry = h.registry.resolve(KEY)
    x = np.ones((2, 4), np.float32)
    out = await entry.batcher.infer({"x": x}, ["y"])
    np.testing.assert_allclose(out["y"], MLP(x), rtol=1e-5)

    await h.deliver(host, placed)  # redelivered: nothing twice
    assert len(h.loader.calls) == 1 and len(h.bus.of(ModelReady)) == 1
    assert await h.types(job) == ["submitted", "placed", "started"]


async def test_a_placement_on_another_node_is_not_this_hosts(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    await h.place(host, job, node="node-b")
    assert h.loader.calls == [] and (await h.view(job)).state == "placed"


async def test_a_checksum_mismatch_fails_the_job_at_once_and_the_ready_version_keeps_serving(h):
    await h.publish(MLP.bytes)
    await h.publish(Mlp(seed=4).bytes)
    host = h.host()
    v1 = await h.submit(version=1)
    await h.place(host, v1)
    await h.wait(v1, "running")
    stored = (await h.catalog.get("vision", "mnist")).find(2).uri
    damage(stored)
    v2 = await h.submit(version=2)
    await h.place(host, v2)
    view = await h.wait(v2, "failed")
    assert view.failure_reason == FailureReason.START_FAILED and view.attempt == 1  # never retried
    assert view.message.startswith(f"{CHECKSUM_MISMATCH}: ")
    [failed] = h.bus.of(ModelFailed)
    assert (failed.version, failed.job_id, failed.reason) == (2, v2, CHECKSUM_MISMATCH)
    assert h.registry.resolve(KEY).version == 1
    assert h.registry.ready_versions(KEY) == [1]


async def test_a_graph_onnx_runtime_refuses_fails_with_invalid_model(h):
    await h.publish(unloadable())
    host = h.host()
    job = await h.submit()
    await h.place(host, job)
    view = await h.wait(job, "failed")
    assert view.message.startswith(f"{INVALID_MODEL}: ONNX Runtime cannot load the model")
    assert [f.reason for f in h.bus.of(ModelFailed)] == [INVALID_MODEL]
    assert KEY not in h.registry.models


async def test_undeploy_releases_the_session_and_records_cancelled(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    await h.place(host, job)
    await h.wait(job, "running")
    await h.record(host, JobCancelRequested(job_id=job, by="ana"))
    view = await h.wait(job, "cancelled")
    assert view.attempt == 1
    assert KEY not in h.registry.models and host.sessions.by_job == {}


async def test_a_cancel_while_loading_is_settled_once_the_load_ends(h):
    await h.publish(MLP.bytes)
    host = h.host(CountingLoader(delay=0.3))
    job = await h.submit()
    placing = asyncio.create_task(h.place(host, job))
    await h.until(lambda: host.sessions.by_job)
    await h.record(host, JobCancelRequested(job_id=job, by="ana"))
    await placing
    await h.wait(job, "cancelled")
    assert "started" not in await h.types(job) and h.bus.of(ModelReady) == []
    assert KEY not in h.registry.models


async def test_a_preemption_releases_it_and_requeues_the_job(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    await h.place(host, job)
    await h.wait(job, "running")
    await h.record(host, JobPreempted(job_id=job, attempt=1, cause=PreemptionCause.PRIORITY, by_job="urgent"))
    view = await h.wait(job, "queued")
    ended = view.attempts[0]
    assert view.attempt == 2 and (ended.outcome, ended.preemption) == (
        AttemptOutcome.PREEMPTED,
        PreemptionCause.PRIORITY,
    )
    assert ended.message == preemption_text(PreemptionCause.PRIORITY)
    assert KEY not in h.registry.models


async def test_an_end_recorded_elsewhere_releases_the_session(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    await h.place(host, job)
    await h.wait(job, "running")
    await h.record(host, JobRequeued(job_id=job, attempt=2, reason=RequeueReason.NODE_LOST))
    assert KEY not in h.registry.models and host.sessions.by_job == {}


async def test_two_replicas_of_a_version_on_one_node_keep_it_serving_when_one_goes(h):
    await h.publish(MLP.bytes)
    host = h.host()
    first, second = await h.submit(), await h.submit()
    for job in (first, second):
        await h.place(host, job)
        await h.wait(job, "running")
    await h.record(host, JobCancelRequested(job_id=first, by="ana"))
    await h.wait(first, "cancelled")
    assert h.registry.resolve(KEY).version == 1
    assert h.registry.resolve(KEY).model is host.sessions.get(second).model


async def test_after_a_restart_what_runs_here_is_loaded_again_and_nothing_is_recorded_twice(h):
    await h.publish(MLP.bytes)
    host = h.host()
    running, placed = await h.submit(), await h.submit()
    await h.place(host, running)
    await h.wait(running, "running")
    view = await h.view(placed)
    await h.ledger.append(  # placed while the serving service was down: never delivered
        placed,
        JobPlaced(
            job_id=placed,
            attempt=view.attempt,
            placements=[ReplicaPlacement(replica=0, node=NODE, gpus=[GpuShare(index=0, fraction=0.25)])],
        ),
    )
    before = await h.types(running)
    restarted = h.host()
    await restarted.reconcile()
    await h.wait(placed, "running")
    assert await h.types(running) == before
    assert {r.job_id for r in h.bus.of(ModelReady)} == {running, placed}
    assert h.registry.resolve(KEY).version == 1
    await restarted.reconcile()  # again: nothing more
    assert len(h.loader.calls) == 2


async def test_a_model_store_that_cannot_be_read_is_a_replica_that_could_not_start_and_is_retried(h):
    await h.publish(MLP.bytes)
    os.remove((await h.catalog.get("vision", "mnist")).find(1).uri)
    host = h.host()
    job = await h.submit()
    await h.place(host, job)
    view = await h.wait(job, "queued")
    assert view.attempt == 2 and view.not_before is not None
    assert view.attempts[0].summary == f"requeued: {RequeueReason.RETRY}"
    assert "store_unavailable: model file" in view.attempts[0].message
    assert [f.reason for f in h.bus.of(ModelFailed)] == ["store_unavailable"]


async def test_a_cancel_of_a_replica_never_taken_on_here_is_settled_and_its_late_placement_ignored(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    view = await h.view(job)
    placed = JobPlaced(
        job_id=job,
        attempt=view.attempt,
        placements=[ReplicaPlacement(replica=0, node=NODE, gpus=[GpuShare(index=0, fraction=0.25)])],
    )
    await h.ledger.append(job, placed)  # (not delivered yet)
    await h.record(host, JobCancelRequested(job_id=job, by="ana"))
    await h.wait(job, "cancelled")
    await h.deliver(host, placed)
    assert h.loader.calls == [] and h.bus.of(ModelReady) == []


async def test_a_placement_the_event_store_does_not_hold_is_ignored(h):
    await h.publish(MLP.bytes)
    host = h.host()
    job = await h.submit()
    forged = JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node=NODE, gpus=[])])
    await h.deliver(host, forged)  # never stored
    assert h.loader.calls == [] and (await h.view(job)).state == "queued"
