"""A user's activity in dev environments, as the submit service's proxy sees it (docs/dev.md#idle-environments):
what counts (`counts_socket`, `counts_request`) and the `dev.activity` events that say so, at most one per
environment every `every` seconds (`ActivityNotes`), published in the background: noting costs the request or
the WebSocket message a clock read and a dictionary lookup, never a wait on the bus.

What counts: a message the browser sends on a kernel's or a terminal's WebSocket, and a request that changes
something (any method but GET, HEAD, OPTIONS: saving a notebook, running a cell through the REST API).
JupyterLab's own polling (GETs), and the WebSockets it keeps open for itself (events, collaboration), do not.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import HTTPConnection

from gpuyard.shared.auth.sessions import SAFE_METHODS
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.jobstate import JobView

log = logging.getLogger(__name__)
EVERY = 60.0
"""The most often one environment's activity is published (seconds)."""
SHORTEST = 1.0
KEPT = 4096
"""Environments remembered before the ones not heard from for their `every` are forgotten."""
ACTIVE_SOCKET = re.compile(r"(api/kernels/[^/]+/channels|terminals/websocket/[^/]+)/?")
"""The WebSockets (their paths under `/dev/{id}/`) on which what the browser sends is the user's doing."""

Publish = Callable[[CloudEvent], Awaitable[object]]


def counts_socket(path: str) -> bool:
    """Whether the browser's messages on the WebSocket at `path` (under `/dev/{id}/`) are activity."""
    return ACTIVE_SOCKET.fullmatch(path) is not None


def counts_request(method: str) -> bool:
    """Whether a request of `method` to an environment is activity (its reads are JupyterLab's polling)."""
    return method.upper() not in SAFE_METHODS


def every_for(idle_timeout: float | None) -> float | None:
    """How often an environment's activity is published: every minute, or a quarter of its idle timeout when
    that is shorter (at least a second), so that it is kept alive however short its timeout; None for one that
    is never stopped for idleness (timeout 0)."""
    if idle_timeout is None:
        return EVERY
    if idle_timeout <= 0:
        return None
    return max(SHORTEST, min(EVERY, idle_timeout / 4))


@dataclass(slots=True)
class _Noted:
    attempt: int
    at: float
    every: float


class ActivityNotes:
    """Per environment (its job), when its activity was last published; one `dev.activity` per `every`."""

    def __init__(self, publish: Publish | None, source: str, *, clock: Callable[[], float] = time.monotonic):
        """`publish(event)`: the bus's (None: no bus, nothing is published)."""
        self.publish = publish
        self.source = source
        self.clock = clock
        self.noted: dict[str, _Noted] = {}
        self.sending: set[asyncio.Task] = set()

    def note(self, view: JobView) -> bool:
        """The user was active in the environment `view` (a running dev job) just now: True when this is
        published (its first activity, or the first after its `every`), False when it was just said."""
        every = every_for(view.spec.idle_timeout)
        if self.publish is None or every is None:
            return False
        now = self.clock()
        last = self.noted.get(view.job_id)
        if last is not None and last.attempt == view.attempt and now - last.at < last.every:
            return False
        if len(self.noted) >= KEPT:
            self._forget(now)
        self.noted[view.job_id] = _Noted(view.attempt, now, every)
        data = DevActivity(job_id=view.job_id, attempt=view.attempt, tenant=view.tenant, at=datetime.now(UTC))
        task = asyncio.get_running_loop().create_task(
            self._send(make_event(data, source=self.source, time=data.at))
        )
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)
        return True

    def noter(self, view: JobView) -> Callable[[], None]:
        """`note(view)` as a callback of no arguments (for each message of a WebSocket)."""

        def noted() -> None:
            self.note(view)

        return noted

    async def _send(self, event: CloudEvent) -> None:
        assert self.publish is not None
        try:
            await self.publish(event)
        except Exception as exc:  # the bus away: the next activity tries again
            data = event.data
            assert isinstance(data, DevActivity)
            noted = self.noted.get(data.job_id)
            if noted is not None and noted.attempt == data.attempt:
                del self.noted[data.job_id]
            log.info("dev environment %s: its activity is not published: %s", data.job_id, exc)

    def _forget(self, now: float) -> None:
        for job_id in [j for j, n in self.noted.items() if now - n.at >= n.every]:
            del self.noted[job_id]


def notes_of(conn: HTTPConnection) -> ActivityNotes:
    """The app's notes: `app.state.dev_activity`, made at the first use with its context's bus."""
    state = conn.app.state
    notes = getattr(state, "dev_activity", None)
    if notes is None:
        ctx = state.ctx
        publish = ctx.bus.publish if ctx.bus is not None else None
        notes = state.dev_activity = ActivityNotes(publish, ctx.ledger.source)
    return notes
