"""What a service's bus goes through, as its /readyz says it: whether it is connected to NATS now, whether
JetStream takes its publishes (it does not while a stream elects a leader, on a clustered bus when a server is
lost, or while the only server restarts), and the last trouble it had, with when and how it ended, so that a
reconnect of half a second is still told after the fact (`report`).

The bus (`gpuyard.shared.bus.jetstream`) tells it: nats-py's disconnect and reconnect callbacks, and the
outcome of each publish (an ack clears a JetStream trouble; no responders, a timeout or a 503 sets it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

log = logging.getLogger(__name__)

UNAVAILABLE = 503


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def jetstream_unanswered(exc: BaseException) -> bool:
    """Whether a failed publish says JetStream did not take it for now (no stream leader, no server), rather
    than that the event itself was refused."""
    unanswered = (
        NoRespondersError | NoStreamResponseError | NatsTimeout | TimeoutError | ServiceUnavailableError
    )
    if isinstance(exc, unanswered):
        return True
    return isinstance(exc, APIError) and exc.code == UNAVAILABLE


class BusState:
    """The bus's state now (`trouble`: None when all is well) and its last trouble."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.server: str | None = None
        """The server it is (or was last) connected to."""
        self.trouble: str | None = None
        """What is wrong now: `reconnecting to NATS`, `JetStream not answering …`; None: connected and answered."""
        self.since: float | None = None
        self.last: dict[str, object] | None = None
        """The last trouble that ended: what, from when, until when, and how it ended."""

    def _begin(self, what: str) -> None:
        if self.trouble is None:
            self.since = self.clock()
            log.warning("bus: %s", what)
        self.trouble = what

    def _end(self, how: str) -> None:
        if self.trouble is None:
            return
        ended = self.clock()
        since = self.since if self.since is not None else ended
        self.last = {"trouble": self.trouble, "since": _at(since), "until": _at(ended), "ended": how}
        log.warning("bus: %s after %.1fs (%s)", how, ended - since, self.trouble)
        self.trouble, self.since = None, None

    def connected(self, server: str | None) -> None:
        self.server = server

    def disconnected(self) -> None:
        """nats-py lost its server: it reconnects to one of the others (or the same) by itself."""
        self._begin(f"reconnecting to NATS (lost {self.server or 'its server'})")

    def reconnected(self, server: str | None) -> None:
        self.server = server
        self._end(f"reconnected to {server or 'NATS'}")

    def publish_failed(self, exc: BaseException) -> None:
        """A publish got no ack: JetStream's trouble, when the error says JetStream did not answer."""
        if self.trouble is not None and self.trouble.startswith("reconnecting"):
            return  # (the reconnect says it)
        if jetstream_unanswered(exc):
            why = str(exc) or type(exc).__name__
            self._begin(f"JetStream not answering publishes (a stream leader election, or no server): {why}")

    def published(self) -> None:
        """A publish was acknowledged: JetStream answers again."""
        if self.trouble is not None and self.trouble.startswith("JetStream"):
            self._end("JetStream answers again")

    def report(self) -> dict[str, object]:
        """What /readyz says of the bus: its state now and its last trouble."""
        now: dict[str, object] = {"state": self.trouble or "connected", "server": self.server}
        if self.since is not None:
            now["since"] = _at(self.since)
        if self.last is not None:
            now["last_trouble"] = self.last
        return {"bus": now}
