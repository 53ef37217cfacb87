"""What `gpuyard up` tells the platform about the service processes it runs: a service that keeps crashing
cannot say so itself, so its supervisor does, on the bus (`service.status`, shared/contracts/events/), as the
`supervisor` bus user, which may publish that and nothing else (shared/bus/permissions.py). The submit service
keeps the latest of each process for `GET /v1/services`.

Reporting never holds the supervisor up: `update` only records, and a task of its own connects (again and
again while NATS is not there), publishes each change in order and, every interval, the latest status of
every process, each publish bounded in time. With NATS down, or its streams not declared yet, a status is
lost: the next round says it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable
from pathlib import Path

from gpuyard.shared.bus.credentials import CredentialsError, read_credentials
from gpuyard.shared.bus.jetstream import Bus, BusRefused, BusUnavailable
from gpuyard.shared.bus.permissions import Role
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.services import (
    LAST_ERROR_CHARS,
    SERVICE_HEARTBEAT_SECONDS,
    ServiceStatus,
)

log = logging.getLogger(__name__)

PUBLISH_SECONDS = 2.0
"""The most one publish may take (NATS away: the client waits for a reply that does not come)."""
CONNECT_RETRY_SECONDS = 1.0
PENDING_CHANGES = 256
"""Changes kept while they cannot be published (the oldest dropped first: the latest of each is said again)."""


def last_words(text: str) -> str | None:
    """A process's last line as a status carries it: None when empty, at most LAST_ERROR_CHARS."""
    text = text.strip()
    if not text:
        return None
    return text if len(text) <= LAST_ERROR_CHARS else text[: LAST_ERROR_CHARS - 1] + "…"


class StatusReporter:
    """Publishes the `service.status` of each supervised process: each change at once, all every `interval`."""

    def __init__(
        self,
        servers: list[str],
        credentials: Path,
        *,
        tls_ca: Path | None = None,
        interval: float = SERVICE_HEARTBEAT_SECONDS,
        say: Callable[[str], None] = print,
    ):
        """`say`: how the one line about a bus that refuses the supervisor reaches its console."""
        self.servers = servers
        self.credentials = credentials
        self.tls_ca = tls_ca
        self.interval = interval
        self.say = say
        self.source = f"/gpuyard/{Role.SUPERVISOR.value}/{socket.gethostname()}"
        self.latest: dict[str, ServiceStatus] = {}
        """By process name: what is said again every interval."""
        self.changes: deque[ServiceStatus] = deque(maxlen=PENDING_CHANGES)
        self._wake = asyncio.Event()
        self._bus: Bus | None = None
        self._closing = False

    def update(self, status: ServiceStatus) -> None:
        """Record `status`; the reporting task publishes it at once. Never blocks, never raises."""
        self.latest[status.process] = status
        self.changes.append(status)
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled: connect, then publish the changes as they come and everything every interval. A
        bus that refuses the supervisor's user (its credentials) ends the reporting, with one line."""
        try:
            self._bus = await self._connect()
        except (BusRefused, CredentialsError) as exc:
            self.say(f"cannot report the services' states on the bus: {exc}")
            return
        due = asyncio.get_running_loop().time() + self.interval
        while not self._closing:  # (also when a cancellation was lost: asyncio.wait_for can swallow one)
            timeout = max(0.0, due - asyncio.get_running_loop().time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            await self._publish_changes()
            if asyncio.get_running_loop().time() >= due:
                for status in list(self.latest.values()):
                    await self._publish(status)
                due = asyncio.get_running_loop().time() + self.interval

    async def close(self, task: asyncio.Task | None = None) -> None:
        """Stop `task` (the one running `run`), publish the changes still waiting and close the connection,
        each step bounded in time. Again: nothing to do."""
        self._closing = True
        if task is not None:
            task.cancel()
            self._wake.set()
            # never waited for without a bound: Python 3.11's asyncio.wait_for, inside the task, can swallow
            # the cancellation when its own wait ends at the same moment (the task then ends at its next turn,
            # by `_closing`), and the supervisor's stop must not hang on it
            await asyncio.wait({task}, timeout=PUBLISH_SECONDS)
            if task.done() and not task.cancelled():
                with contextlib.suppress(Exception):
                    task.result()
        if self._bus is not None:
            await _within(self._publish_changes(), PUBLISH_SECONDS)
            await _within(self._bus.close(), PUBLISH_SECONDS)
            self._bus = None

    async def _publish_changes(self) -> None:
        while self.changes:
            await self._publish(self.changes.popleft())

    async def _connect(self) -> Bus:
        credentials = read_credentials(self.credentials)
        while True:
            try:
                return await Bus.connect(
                    self.servers,
                    name="gpuyard-supervisor",
                    source=self.source,
                    connect_timeout=2,
                    credentials=credentials,
                    tls_ca=self.tls_ca,
                )
            except BusRefused:
                raise
            except BusUnavailable:
                await asyncio.sleep(CONNECT_RETRY_SECONDS)

    async def _publish(self, status: ServiceStatus) -> None:
        if (bus := self._bus) is None:  # closed meanwhile
            log.debug("service.status of %s not published: no connection", status.process)
            return
        try:
            await asyncio.wait_for(bus.publish(make_event(status, source=self.source)), PUBLISH_SECONDS)
        except Exception as exc:  # NATS away, no stream yet: said again next round
            log.debug("service.status of %s not published: %r", status.process, exc)


async def _within(step, seconds: float) -> None:
    """Run `step` for at most `seconds`, then cancel it without waiting for the cancellation to be honoured."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
    elif not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()
