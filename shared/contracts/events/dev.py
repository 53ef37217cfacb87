"""Dev environments' events (docs/dev.md)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuyard.shared.contracts.events.envelope import EventData, event
from gpuyard.shared.contracts.events.subjects import Subject


@event(Subject.DEV_ACTIVITY)
class DevActivity(EventData):
    """A user was active in a running dev environment at `at`: a message sent on one of its kernels' or
    terminals' WebSockets, or a request that changes something (saving a notebook, running a cell through the
    REST API), seen by the submit service's proxy; JupyterLab's own polling is not activity. Published at most
    once a minute per environment (every quarter of its idle timeout when that is shorter); the monitor's idle
    reclaim counts the environment busy at `at`, as it counts a busy sample of its GPUs.

    Telemetry, as `gpu.sample` is: it changes nothing of the job's state, so it is carried by the telemetry
    stream (kept an hour) and never recorded in the event store; a lost one only shortens the environment's
    idle window by as much as the interval between two of them."""

    job_id: str
    attempt: int = Field(ge=0, description="The attempt that runs the environment.")
    tenant: str = Field(description="The environment's tenant.")
    at: datetime = Field(description="When the user's message or request came (the submit service's clock).")
