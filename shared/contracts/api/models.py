"""Published models, their versions and deployments as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, StrictBool

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.api.jobs import CancelOut, JobAccepted, JobOut, PendingOut
from gpuyard.shared.contracts.events.models import TensorSpec
from gpuyard.shared.contracts.fieldtypes import JSON_INTEGER, Integer, Strict
from gpuyard.shared.contracts.jobspec import (
    DEFAULT_PRIORITY,
    MAX_DEPLOYMENT_REPLICAS,
    MAX_MODEL_VERSION,
    PRIORITY_CLASSES,
    Priority,
    Resources,
)
from gpuyard.shared.contracts.jobstate import JobState


class PublishedVersion(Out):
    """A published version as its publisher needs it: its number, digest, size and signature, not where the
    server keeps its file."""

    version: int
    sha256: str = Field(description="SHA-256 of the file, checked on every load.")
    size_bytes: int
    inputs: list[TensorSpec] = Field(
        description="The graph's inputs: name, v2 datatype, shape (-1: dynamic)."
    )
    outputs: list[TensorSpec]
    job_id: str | None = Field(None, description="The job that published it from inside, if one did.")
    user: str = Field("", description="Who published it (empty for a job).")
    published_at: datetime


class ModelVersionOut(PublishedVersion):
    """One published version of a model: immutable."""

    uri: str = Field(description="Where its ONNX file is in the model store.")


class ModelOut(Out):
    """A model and its listed versions, oldest first."""

    name: str
    tenant: str = Field(description="The tenant that owns it.")
    public: bool = Field(description="Every tenant may see and use it.")
    latest: int | None = Field(description="Its newest version.")
    versions: list[ModelVersionOut]
    created_at: datetime
    updated_at: datetime


class ModelSummaryOut(Out):
    name: str
    tenant: str
    public: bool
    latest: int | None
    versions: int = Field(description="How many versions are listed.")
    updated_at: datetime


class ModelListOut(Out):
    items: list[ModelSummaryOut] = Field(description="By tenant, then name.")


class DeploymentIn(Resources):
    """A deployment of a model version: `replicas` serve jobs, each with these resources (`gpus` may be a
    share of one GPU, e.g. 0.25), placed by the scheduler like any job."""

    version: Annotated[int, Field(ge=1, le=MAX_MODEL_VERSION), JSON_INTEGER] | None = Field(
        None, description="The version to serve (default: the newest published)."
    )
    replicas: Integer = Field(
        1, ge=1, le=MAX_DEPLOYMENT_REPLICAS, description="How many replicas (serve jobs)."
    )
    priority: Priority = Field(DEFAULT_PRIORITY, description=f"One of: {', '.join(PRIORITY_CLASSES)}.")

    def resources(self) -> Resources:
        """The resources of one replica."""
        return Resources.model_validate(self.model_dump(include=set(Resources.model_fields)))


class DeploymentAccepted(Out):
    """The serve jobs queued for a deployment, one per replica."""

    name: str = Field(description="The model's name.")
    tenant: str = Field(description="The tenant that owns the model.")
    version: int
    jobs: list[JobAccepted] = Field(description="One serve job per replica, named NAME:VERSION.")

    @property
    def job_ids(self) -> list[str]:
        return [j.job_id for j in self.jobs]


class ReplicaOut(Out):
    """One replica of a deployment: a serve job, as `gpuyard ps` shows it."""

    job_id: str
    tenant: str = Field(description="The tenant that runs it (whose quota it uses).")
    version: int
    state: JobState
    node: str | None = Field(None, description="Where it is placed, once placed.")
    gpus: float = Field(description="Its GPU share (0.25: a quarter of one GPU).")
    gpu_index: int | None = Field(None, description="The GPU it holds on its node, once placed.")
    pending: PendingOut | None = Field(None, description="Why it waits, while queued.")
    message: str = ""


class DeploymentListOut(Out):
    name: str
    tenant: str = Field(description="The tenant that owns the model.")
    replicas: list[ReplicaOut] = Field(description="The live serve jobs of the model, newest first.")


class UndeployedOut(Out):
    name: str
    tenant: str = Field(description="The tenant that owns the model.")
    cancelled: list[CancelOut] = Field(description="The serve jobs cancelled (or being stopped).")


class ModelPublishedOut(PublishedVersion):
    """The version published, or the one that already held these bytes (`duplicate`)."""

    name: str
    tenant: str
    public: bool
    duplicate: bool = Field(
        description="These bytes were published before: the version that holds them is answered, nothing new."
    )
    deployment: DeploymentAccepted | None = Field(
        None, description="The serve jobs queued for this version, when the call asked for `serve_*`."
    )


class ModelPatch(Strict):
    """What an owner (or an admin) may change of a model."""

    public: StrictBool = Field(description="true: every tenant may see and use it; false: its tenant's only.")


class ModelDeletedOut(Out):
    name: str
    tenant: str
    versions: list[int] = Field(description="The versions removed (their numbers are never given again).")


def replica_out(job: JobOut) -> ReplicaOut:
    """A serve job as one replica of its model's deployment."""
    assert job.spec.serve is not None, "not a serve job"
    placed = job.placements[0] if job.placements and not job.state.terminal else None
    gpu = placed.gpus[0] if placed and placed.gpus else None
    return ReplicaOut(
        job_id=job.job_id,
        tenant=job.tenant,
        version=job.spec.serve.version,
        state=job.state,
        node=placed.node if placed else None,
        gpus=job.spec.resources.gpus,
        gpu_index=gpu.index if gpu else None,
        pending=job.pending,
        message=job.message,
    )
