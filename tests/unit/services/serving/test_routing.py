"""Where the ready replicas are (`services/serving/routing.py`): learned from `model.ready`, forgotten on
`model.failed` and on the end of their job, and pruned against the event store; another node's replicas take
turns, this node's are never a hop."""

from __future__ import annotations

from gpuyard.services.serving.routing import Routes
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobRequeued, RequeueReason
from gpuyard.shared.contracts.events.models import (
    ExecutionProvider,
    ModelFailed,
    ModelReady,
    ModelVisibilityChanged,
)


def ready(job: str, version: int, node: str) -> ModelReady:
    return ModelReady(
        name="mnist", tenant="vision", version=version, job_id=job, node=node,
        endpoint=f"http://{node}:8000", provider=ExecutionProvider.CPU,
    )  # fmt: skip


async def deliver(routes: Routes, data) -> None:
    await routes.handlers(make_event(data, source="/test"))


async def test_replicas_come_with_ready_and_go_with_failed_or_the_end_of_their_job():
    routes = Routes("node-a")
    for job, version, node in (
        ("j1", 1, "node-a"),
        ("j2", 2, "node-b"),
        ("j3", 2, "node-c"),
        ("j4", 2, "node-b"),
    ):
        await deliver(routes, ready(job, version, node))
    assert routes.versions("vision/mnist") == [1, 2]
    assert routes.remote("vision/mnist", 1) is None  # this node's own: never a hop
    seen = {routes.remote("vision/mnist", 2).job_id for _ in range(6)}
    assert seen == {"j2", "j3", "j4"}  # they take turns
    await deliver(routes, JobCancelled(job_id="j2", attempt=1, by="ana"))
    await deliver(routes, JobRequeued(job_id="j3", attempt=2, reason=RequeueReason.NODE_LOST))
    await deliver(
        routes,
        ModelFailed(
            name="mnist", tenant="vision", version=2, job_id="j4", node="node-b", reason="x", message="y"
        ),
    )
    assert routes.versions("vision/mnist") == [1] and routes.holds("vision/mnist")


async def test_a_replica_announced_again_is_one_replica_and_pruning_drops_ended_jobs():
    routes = Routes("node-a")
    await deliver(routes, ready("j1", 1, "node-b"))
    await deliver(routes, ready("j1", 1, "node-c"))  # its next attempt, elsewhere
    assert [routes.remote("vision/mnist", 1).node for _ in range(2)] == ["node-c", "node-c"]
    await deliver(routes, ready("j2", 1, "node-b"))

    async def running(job_ids):
        return {"j2"}

    await routes.prune(running)
    assert set(routes.by_job) == {"j2"}


async def test_a_model_event_tells_the_access_cache():
    routes = Routes("node-a")
    changed = []
    routes.on_model_change = lambda tenant, name: changed.append((tenant, name))
    await deliver(routes, ModelVisibilityChanged(name="mnist", tenant="vision", public=True))
    assert changed == [("vision", "mnist")]
