"""A version a deployment serves is not deleted: the model registry reads the live serve jobs of the model
from the event store's job projections (`deployed_versions`), refuses to delete what they serve (409, naming
the replicas and the call that undeploys them), and deletes it once they have ended. A real embedded store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.envelope import EventData
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobCancelled,
    JobFailed,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec, ServeSpec
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.readmodels.modelregistry import ModelError, ModelRegistry, deployed_versions
from tests.unit.services.submit.onnxmodels import tiny_model

ANA = Principal(tenant="vision", user="ana")


class Platform:
    """The registry and the job ledger on one embedded event store, driven from a test's own event loop."""

    def __init__(self, folder: Path):
        self.loop = asyncio.new_event_loop()
        self.store = self.run(open_store(f"sqlite:///{folder / 'events.db'}"))
        self.ledger = JobLedger(self.store, None, "/test")
        self.models = ModelRegistry(self.store, None, "/test", ModelStore(str(folder / "models")))

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    def publish(self, tenant: str, name: str, scale: float) -> int:
        return self.run(self.models.publish(tenant=tenant, name=name, data=tiny_model(scale))).version.version

    def job(self, job_id: str, tenant: str, spec: JobSpec, *, running: bool = True) -> str:
        """A job of `tenant` submitted (queued), or placed and started (`running`)."""
        events: list[EventData] = [
            JobSubmitted(job_id=job_id, name=job_id, tenant=tenant, user="u", spec=spec)
        ]
        if running:
            events += [
                JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
                JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0]),
            ]
        for data in events:
            self.record(job_id, data)
        return job_id

    def serve_job(
        self, job_id: str, tenant: str, model: str, version: int, owner: str | None = None, **kw
    ) -> str:
        serve = ServeSpec(model=model, version=version, tenant=owner)
        return self.job(job_id, tenant, JobSpec(tenant=tenant, serve=serve, replicas=1), **kw)

    def record(self, job_id: str, data: EventData) -> None:
        outcome = self.run(self.ledger.append(job_id, data))
        assert outcome.applied, outcome.refused

    def deployed(self, tenant: str, name: str) -> dict[int, list[str]]:
        view = self.run(self.models.get(tenant, name))
        found = self.run(deployed_versions(self.store, view))
        return {version: [job.job_id for job in jobs] for version, jobs in found.items()}

    def delete(
        self, tenant: str, name: str, version: int | None, viewer: Principal | None = ANA
    ) -> list[int]:
        return self.run(self.models.delete(tenant, name, version, "ana", viewer=viewer))

    def refusal(self, tenant: str, name: str, version: int | None, viewer: Principal | None = ANA) -> str:
        with pytest.raises(ModelError) as refused:
            self.delete(tenant, name, version, viewer)
        assert refused.value.status == 409, refused.value
        return str(refused.value)

    def versions(self, tenant: str, name: str) -> list[int]:
        view = self.run(self.models.get(tenant, name))
        return [v.version for v in view.versions] if view else []


@pytest.fixture
def platform(tmp_path) -> Iterator[Platform]:
    p = Platform(tmp_path)
    try:
        yield p
    finally:
        p.close()


def test_the_deployed_versions_are_those_the_models_live_serve_jobs_serve(platform):
    for scale in (2.0, 3.0, 4.0):
        platform.publish("vision", "mnist", scale)
    platform.publish("nlp", "mnist", 2.0)  # another tenant's model of the same name
    v1 = platform.serve_job("a000000000000001", "vision", "mnist", 1)
    v2 = platform.serve_job("a000000000000002", "nlp", "mnist", 2, owner="vision", running=False)  # public
    v1_too = platform.serve_job("a000000000000003", "vision", "mnist", 1, running=False)
    ended = platform.serve_job("a000000000000004", "vision", "mnist", 3)
    platform.record(ended, JobCancelled(job_id=ended, attempt=1, by="ana"))
    platform.serve_job("a000000000000005", "nlp", "mnist", 3)  # nlp's own mnist
    platform.serve_job("a000000000000006", "vision", "fashion", 3)  # another model
    platform.job("a000000000000007", "vision", JobSpec(tenant="vision", command="true"))  # no serve job
    assert platform.deployed("vision", "mnist") == {1: [v1_too, v1], 2: [v2]}  # each newest first
    assert platform.deployed("nlp", "mnist") == {3: ["a000000000000005"]}


def test_a_version_a_live_replica_serves_is_not_deleted_and_the_refusal_names_the_replica(platform):
    for scale in (2.0, 3.0):
        platform.publish("vision", "mnist", scale)
    job = platform.serve_job("b000000000000001", "vision", "mnist", 1)
    file = Path(platform.run(platform.models.get("vision", "mnist")).find(1).uri)

    why = platform.refusal("vision", "mnist", 1)
    assert why == (
        f"model 'mnist' version 1 is deployed (serve job {job}): "
        "undeploy it first (DELETE /v1/models/mnist/deployments?version=1)"
    )
    assert "version 1 is deployed" in platform.refusal("vision", "mnist", None)  # the whole model: the same
    assert platform.versions("vision", "mnist") == [1, 2] and file.exists()  # nothing deleted

    assert platform.delete("vision", "mnist", 2) == [2]  # a version no replica serves
    platform.record(job, JobFailed(job_id=job, attempt=1, reason=FailureReason.START_FAILED, message="gone"))
    assert platform.deployed("vision", "mnist") == {}
    assert platform.delete("vision", "mnist", 1) == [1]  # its replica ended: deleted
    assert platform.versions("vision", "mnist") == [] and not file.exists()


def test_another_tenants_replicas_of_a_public_model_are_counted_not_named(platform):
    platform.publish("vision", "mnist", 2.0)
    platform.publish("vision", "mnist", 3.0)
    ours = platform.serve_job("c000000000000001", "vision", "mnist", 1)
    theirs = [
        platform.serve_job(f"c00000000000001{i}", "nlp", "mnist", 2, owner="vision", running=i == 0)
        for i in range(2)
    ]

    why = platform.refusal("vision", "mnist", None)
    assert why.startswith("model 'mnist' versions 1, 2 are deployed") and ours in why, why
    assert "2 replicas of other tenants" in why and not any(job in why for job in theirs), why
    assert why.endswith("undeploy them first (DELETE /v1/models/mnist/deployments)"), why
    admin = platform.refusal("vision", "mnist", 2, Principal(tenant="ops", user="root", admin=True))
    assert all(job in admin for job in theirs) and "deployments?version=2&tenant=vision" in admin, admin

    platform.record(ours, JobCancelled(job_id=ours, attempt=1, by="ana"))
    assert platform.delete("vision", "mnist", 1) == [1]  # undeployed; version 2 still deployed
    for job in theirs:
        platform.record(job, JobCancelled(job_id=job, attempt=1, by="bo"))
    assert platform.delete("vision", "mnist", None) == [2]
