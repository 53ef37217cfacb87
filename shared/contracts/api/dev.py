"""Dev environments as the API takes and shows them (`/v1/dev`, docs/dev.md)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.fieldtypes import IdleSeconds, Name, Number, Strict
from gpuyard.shared.contracts.jobspec import DEFAULT_PRIORITY, EnvironmentSpec, Priority
from gpuyard.shared.contracts.jobstate import JobState

DEFAULT_IDLE_TIMEOUT = 2 * 3600.0
"""A dev environment's idle timeout unless it gives one: 2 hours without GPU or kernel use."""


class DevIn(Strict):
    """A dev environment to start: `{"gpus": 0.5, "name": "explore", "idle_timeout": "2h"}`."""

    name: Name | None = Field(None, description="Its name (default `dev-<id>`).")
    gpus: Number = Field(0, ge=0, le=64, description="Whole GPUs, or a share of one (0.5).")
    environment: EnvironmentSpec | None = Field(
        None,
        description="Its own software (`{pip: [torch, jupyterlab]}`), as a job's `environment` "
        "(docs/environments.md); jupyterlab must be among its packages. Unset: the node's own install.",
    )
    idle_timeout: IdleSeconds | None = Field(
        None,
        description="Stopped after this long with its GPUs and kernels idle, e.g. '30m' (default 2h; 0 or 'off': "
        "never).",
    )
    priority: Priority = Field(DEFAULT_PRIORITY, description="Its priority class, as a job's.")


class DevOut(Out):
    job_id: str
    name: str
    tenant: str
    user: str = ""
    state: JobState
    url: str = Field(description="Its JupyterLab, on the API's address (while it runs).")
    gpus: float
    idle_timeout: float | None = Field(None, description="Seconds (None: never stopped for idling).")
    notebooks: str | None = Field(
        None,
        description="The volume that holds its notebooks (kept after it ends), if the platform has volumes.",
    )
    submitted_at: datetime | None = None
    message: str = Field("", description="Why it is not running, or how it ended.")


class DevListOut(Out):
    items: list[DevOut]
