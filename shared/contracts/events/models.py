"""The events of published models: published, visibility, deleted, and a serving replica's ready or failed."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.contracts.events.envelope import EventData, event
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class TensorSpec(BaseModel):
    """One input or output of a model, as its ONNX graph declares it."""

    model_config = ConfigDict(frozen=True)
    name: str
    datatype: str = Field(..., description="Open Inference Protocol datatype: FP32, INT64, BOOL, BYTES…")
    shape: list[int] = Field(..., description="Dimensions; -1 for a dynamic one (a batch, a sequence).")


class _ModelEvent(EventData):
    name: str = Field(..., pattern=NAME_PATTERN)
    tenant: str = Field(..., pattern=NAME_PATTERN, description="The tenant that owns the model.")

    def entity(self) -> str | None:
        return f"{self.tenant}/{self.name}"  # a model's name is its tenant's: two tenants may use the same


@event(Subject.MODEL_PUBLISHED)
class ModelPublished(_ModelEvent):
    """A version of a model is in the model store, immutable: its bytes are `sha256` for good (the same
    version with other bytes is refused), and every load checks them. (Version 1 of this event's data: the
    earlier placeholder was never published.)"""

    version: int = Field(..., ge=1, description="1, 2, 3… per tenant and name, assigned unless given.")
    uri: str = Field(..., description="Where the ONNX file is: a local path or an fsspec URL (s3://…).")
    sha256: str = Field(..., pattern=SHA256_PATTERN, description="SHA-256 of the file, hex.")
    size_bytes: int = Field(..., ge=0)
    inputs: list[TensorSpec] = Field(default_factory=list, description="The graph's inputs.")
    outputs: list[TensorSpec] = Field(default_factory=list, description="The graph's outputs.")
    job_id: str | None = Field(None, description="The job that published it, from inside (its token).")
    user: str = Field("", description="Who published it (the token's user; empty for a job).")
    public: bool = Field(False, description="Whether every tenant may see and use the model.")
    format: Literal["onnx"] = "onnx"


@event(Subject.MODEL_VISIBILITY_CHANGED)
class ModelVisibilityChanged(_ModelEvent):
    """A model was made public (every tenant may see and use it) or private again (its tenant's only)."""

    public: bool
    by: str = ""


@event(Subject.MODEL_DELETED)
class ModelDeleted(_ModelEvent):
    """Versions of a model were removed from its listing and their files from the model store. A version's
    number is never given again."""

    versions: list[int] = Field(..., description="The versions removed.")
    whole_model: bool = Field(False, description="Every version was asked for (`DELETE /v1/models/{name}`).")
    by: str = ""


class ExecutionProvider(StrEnum):
    """The ONNX Runtime execution provider a replica's session runs on."""

    CUDA = "CUDAExecutionProvider"
    CPU = "CPUExecutionProvider"


@event(Subject.MODEL_READY)
class ModelReady(_ModelEvent):
    """A replica of a deployment (its serve job) holds the model's session and answers requests: the serving
    service of `node` routes to it, and the others send it their requests for this model through one hop to
    `endpoint`. The newest ready version of a model is its default."""

    version: int = Field(..., ge=1, description="The version the replica serves.")
    job_id: str = Field(..., description="The serve job (one replica of the deployment).")
    node: str = Field(..., description="The node whose serving service holds the session.")
    endpoint: str = Field(..., description="That serving service's URL, e.g. http://10.0.0.7:8000.")
    provider: ExecutionProvider = Field(..., description="Where the session runs: CUDA, or the CPU.")
    device: int | None = Field(None, description="The GPU index on the node (CUDA), None on the CPU.")


@event(Subject.MODEL_FAILED)
class ModelFailed(_ModelEvent):
    """A replica could not load (or lost) the model: a checksum mismatch, an ONNX graph ONNX Runtime refuses,
    a provider that cannot start. The versions already ready keep serving."""

    version: int = Field(..., ge=1)
    job_id: str = Field(..., description="The serve job whose replica failed.")
    node: str
    reason: str = Field(..., description="Why, for machines: checksum_mismatch, invalid_model, load_failed…")
    message: str = Field(..., description="Why, for people.")
