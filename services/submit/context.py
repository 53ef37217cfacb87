"""What the submit service's routes depend on, gathered in one object so tests can build it without NATS."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.submit.queuedepth import QueueDepth
from services.submit.telemetry import Telemetry
from shared.bus import Bus
from shared.ledger import JobLedger
from shared.logstore import LogStore
from shared.store import EventStore
from shared.tokens import Tokens


@dataclass
class SubmitContext:
    store: EventStore
    ledger: JobLedger
    tokens: Tokens
    """Looked up on every request (`Tokens.authenticate`): a revocation counts at once."""
    logs: LogStore
    """Jobs' output, shipped there by the executors (`shared.logstore`): read from any node."""
    bus: Bus | None = None
    telemetry: Telemetry = field(default_factory=lambda: Telemetry())
    max_body_bytes: int = 1 << 20
    queue: QueueDepth = field(default_factory=QueueDepth)
    accept_unplaceable: bool = False
    """Queue a job no node could ever hold (for a cluster that grows) instead of refusing it."""
    """Jobs waiting per tenant, and each tenant's limit on them (none by default)."""
