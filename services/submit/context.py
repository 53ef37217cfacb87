"""What the submit service's routes depend on, gathered in one object so tests can build it without NATS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuyard.services.submit.placeability import Placeability
from gpuyard.services.submit.queuedepth import QueueDepth
from gpuyard.services.submit.telemetry import Telemetry
from gpuyard.services.submit.volumefiles import VolumeFiles
from gpuyard.services.submit.volumemetrics import VolumeMetrics
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.modelfiles.signature import CheckBounds
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.paths import job_storage
from gpuyard.shared.runtime.safefolder import SafeFolder
from gpuyard.shared.settings.storage import quota_of
from gpuyard.shared.stores.events import EventStore
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import LogStore
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry
from gpuyard.shared.stores.readmodels.queueline import LineReader
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry


@dataclass
class Uploads:
    """Model uploads in progress, per tenant (`POST /v1/models`, in this instance): each holds a connection, a
    file being written and then a process checking it, so a tenant may have `limit` at once."""

    limit: int = 2
    held: dict[str, int] = field(default_factory=dict)

    def take(self, tenant: str) -> bool:
        """One more for `tenant`; False when it has `limit` already."""
        if self.held.get(tenant, 0) >= self.limit:
            return False
        self.held[tenant] = self.held.get(tenant, 0) + 1
        return True

    def give_back(self, tenant: str) -> None:
        left = self.held.get(tenant, 0) - 1
        if left > 0:
            self.held[tenant] = left
        else:
            self.held.pop(tenant, None)


@dataclass(frozen=True)
class JobOutputs:
    """Jobs' kept outputs (`/v1/jobs/{id}/artifacts`): each job's output folder in the storage root `root`,
    read as its tenant's user (`owner_of`: the user its jobs run as; None: the platform's)."""

    root: Path
    owner_of: Callable[[str], JobUser | None]

    def folder(self, tenant: str, job_id: str) -> SafeFolder:
        user = self.owner_of(tenant)
        return SafeFolder(job_storage(self.root, tenant, job_id).outputs, user.uid if user else None)


@dataclass
class SubmitContext:
    store: EventStore
    ledger: JobLedger
    tokens: Tokens
    """Looked up on every request (`Tokens.authenticate`): a revocation counts at once."""
    logs: LogStore
    """Jobs' output, shipped there by the executors (`gpuyard.shared.stores.logs`): read from any node."""
    bus: Bus | None = None
    telemetry: Telemetry = field(default_factory=lambda: Telemetry())
    max_body_bytes: int = 1 << 20
    queue: QueueDepth = field(default_factory=QueueDepth)
    accept_unplaceable: bool = False
    """Queue a job no node could ever hold (for a cluster that grows) instead of refusing it."""
    placeability: Placeability = field(init=False)
    """Whether some node heard from (`telemetry`) could ever hold a job: the scheduler's own rule."""
    models: ModelRegistry | None = None
    """Published models (`/v1/models`): their events in the store, their files in the model store."""
    max_model_bytes: int = 1 << 30
    uploads: Uploads = field(default_factory=Uploads)
    """Model uploads in progress per tenant, and how many one may have (`max_uploads_per_tenant`)."""
    model_check: CheckBounds = field(default_factory=CheckBounds)
    """The time and memory the check of an uploaded model may take (`model_check_timeout`, `_memory`)."""
    publish_secret_file: Path | None = None
    """The secret that signs jobs' publish tokens (`gpuyard.shared.auth.jobtokens`); None: no job may publish."""
    session_secret: bytes | None = None
    """The key that signs dashboard sessions (`shared/auth/sessions.py`); None: no dashboard login."""
    session_lifetime: float = 12 * 3600.0
    serving_url: str = ""
    """The serving entry point's address for the dashboard's pages ('' : the page's host, port 8000)."""
    quotas: dict[str, float] = field(default_factory=dict)
    """Guaranteed GPUs per tenant (the scheduler's `GPUYARD_QUOTAS`): what `GET /v1/tenants` shows."""
    volumes: VolumeRegistry | None = None
    """Tenants' volumes (`/v1/volumes`): their events in the store; their files in `volume_files`."""
    volume_files: VolumeFiles | None = None
    volume_default_size: int = 10 << 30
    volume_quotas: dict[str, int] = field(default_factory=dict)
    """What each tenant's volumes may hold together (`GPUYARD_VOLUME_QUOTA`)."""
    job_outputs: JobOutputs | OutputStore | None = None
    """Jobs' kept outputs, read from the storage root (`/v1/jobs/{id}/artifacts`)."""
    volume_metrics: VolumeMetrics | None = None
    """Volumes' size and use for /metrics, shown only to a scrape that `scrape` allows (they name tenants)."""
    scrape: ScrapeAuth | None = None
    """Who may read the figures of /metrics that name tenants (`GPUYARD_METRICS_AUTH`)."""
    line: LineReader = field(init=False)
    """The queue's line (queued jobs' places), read from the store (a reader of `store`)."""

    def __post_init__(self) -> None:
        self.placeability = Placeability(self.telemetry)
        self.line = LineReader(self.store)

    def volume_quota_of(self, tenant: str) -> int:
        return quota_of(self.volume_quotas, tenant)
