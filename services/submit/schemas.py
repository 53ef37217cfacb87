"""What the submit API answers: one model per answer, so no internal field leaks out."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.jobstate import JobState, JobView


class JobAccepted(BaseModel):
    job_id: str
    name: str
    tenant: str
    state: JobState
    duplicate: bool = Field(
        False, description="True when this Idempotency-Key was seen before: nothing new queued."
    )


class JobList(BaseModel):
    items: list[JobView]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next (older) page.")


class StoredEventOut(BaseModel):
    version: int
    event: dict[str, Any] = Field(..., description="The CloudEvent as stored.")


class CancelAnswer(BaseModel):
    job_id: str
    state: JobState
    cancel_requested: bool
    message: str


class DeadLetter(BaseModel):
    seq: int
    consumer: str
    original_subject: str
    error: str
    deliveries: int | None = None
    event: dict[str, Any] | str


class NodeOut(BaseModel):
    node: str
    state: str = Field(description="ready, or lost (the scheduler gave up on its heartbeat)")
    last_seen_seconds_ago: float
    gpus: list[dict[str, Any]]
    cpus: float
    memory_bytes: int
    simulated: bool


class ServiceOut(BaseModel):
    service: str
    instance: str
    host: str
    pid: int
    version: str
    last_seen_seconds_ago: float
