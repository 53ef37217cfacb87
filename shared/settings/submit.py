"""The submit service's settings: the API and dashboard, admission, limits per tenant."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpuyard.shared.settings.common import Duration, Port, Size, TenantNumbers, written
from gpuyard.shared.settings.gateway import GatewaySettings
from gpuyard.shared.settings.scrape import ScrapeSettings
from gpuyard.shared.settings.storage import StorageSettings


class SubmitSettings(StorageSettings, ScrapeSettings, GatewaySettings):
    """The submit API."""

    submit_host: str = Field(
        "127.0.0.1", description="Address the API listens on; another than loopback needs tokens."
    )
    submit_port: Port = Field(8080, description="Port of the API.")
    store_durable_commits: bool = Field(
        True, description="As for every service, on here: a job is accepted (202) once it is on disk."
    )
    accept_unplaceable: bool = Field(
        False,
        description="Queue a job that no node could ever hold, even empty, to wait for a cluster that grows "
        "(new nodes, autoscaling); by default it is refused (422) with the largest node and the whole cluster.",
    )
    tokens_file: Path | None = Field(
        None,
        description="JSON/YAML file of tokens, kept hashed, re-read when it changes: "
        "`{tokens: {sha256:<hex>: {id, tenant, user, admin, created, expires}}}` (a plain token as key is read "
        "too); `gpuyard admin tokens` manages it.",
    )
    tokens: str = Field("", description="Inline tokens: `token=tenant[:user][:admin],…`.")
    session_secret_file: Path | None = Field(
        None,
        description="The key that signs the dashboard's login sessions; default `<data dir>/secrets/session.key`, "
        "made at start (mode 0600). Every submit instance and the serving entry point of one platform need the same key.",
    )
    serving_url: str = Field(
        "",
        description="The serving entry point's address as the dashboard's pages call it (the Models page's "
        "inference form); `gpuyard up` sets it; empty: the page's own host on port 8000.",
    )
    session_lifetime: Duration = Field(
        12 * 3600.0, gt=0, description="How long a dashboard login lasts (`12h`); revoking its token ends it."
    )
    max_body_bytes: int = Field(1 << 20, description="Largest request body the API accepts, in bytes.")
    max_model_bytes: Size = Field(
        written("1GiB"),
        description="Largest ONNX file `POST /v1/models` accepts (a single-file model: ONNX's own limit is 2 "
        "GiB), from a token that may publish; streamed to disk, never held in memory.",
    )
    max_uploads_per_tenant: int = Field(
        2,
        ge=1,
        description="Model uploads (`POST /v1/models`) one tenant may have in progress at once on a submit "
        "instance; one more gets 429 with Retry-After and the reason.",
    )
    model_check_timeout: Duration = Field(
        120.0,
        gt=0,
        description="How long reading and checking an uploaded ONNX file may take (`2m`), in a process of its "
        "own; a file that needs longer is refused (422).",
    )
    model_check_memory: Size = Field(
        written("4GiB"),
        ge=256 * 1024 * 1024,
        description="Address space the process that checks an uploaded ONNX file may use (its RLIMIT_AS: about "
        "three times the file, and 200 MB for the libraries); a file that needs more is refused (422).",
    )
    max_queued_per_tenant: int = Field(
        10_000,
        ge=0,
        description="Jobs a tenant may have waiting to be placed (queued, pending included); a submit beyond "
        "it gets 429 with Retry-After. 0: no limit.",
    )
    queue_limits: TenantNumbers = Field(
        default_factory=dict,
        description="A tenant's own limit instead of max_queued_per_tenant, `vision=50000`; 0: no limit.",
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, as the scheduler's `quotas` (the same variable): the "
        "guaranteed figure of `GET /v1/tenants`.",
    )
