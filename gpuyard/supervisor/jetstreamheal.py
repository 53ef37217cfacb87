"""Healing JetStream after a full disk: NATS, whose streams stop taking writes once one failed, is restarted
once the disk of its store has room again (docs/operations.md, "A full disk")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.markup import escape

from gpuyard.shared.contracts.units import format_size
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.diskroom import free_space, room_again
from gpuyard.supervisor.servicelog import shorten

JETSTREAM_HEAL_BACKOFF = (30.0, 600.0)
"""Seconds between two restarts of NATS to heal its streams, the first and the longest (doubling)."""


class JetStreamHealer:
    """Restarts NATS when it said that JetStream failed a write (`natsserver.jetstream_broken`)."""

    def __init__(
        self,
        store: Path | None,
        say: Callable[[str, str], None],
        restart: Callable[[Child, str], Awaitable[None]],
        stopping: Callable[[], bool],
    ):
        """`store`: NATS's store directory, whose free space says when NATS can be restarted (None: at once);
        `say`: a line on the console, by process; `restart`: the supervisor's restart of a process it decided;
        `stopping`: whether the platform stops (no restart then)."""
        self.store = store
        self.say = say
        self.restart = restart
        self.stopping = stopping
        self.task: asyncio.Task | None = None
        """Waiting for room to restart NATS, whose JetStream failed a write."""
        self.healed_at: float | None = None
        self.backoff = JETSTREAM_HEAL_BACKOFF[0]

    def heal(self, nats: Child, said: str) -> None:
        """NATS said that JetStream failed a write: restart it, which makes every stream write again, once its
        store's disk has room again (ROOM_AGAIN, or an eighth of a smaller file system) and at most every
        JETSTREAM_HEAL_BACKOFF seconds. The services reconnect by themselves, and what they published meanwhile
        and was not acknowledged is published again (each service's outbox relay)."""
        if self.stopping() or (self.task is not None and not self.task.done()):
            return
        self.task = asyncio.create_task(self._heal(nats, said), name="heal-jetstream")

    async def _heal(self, nats: Child, said: str) -> None:
        now = time.monotonic()
        if self.healed_at is not None and now - self.healed_at > JETSTREAM_HEAL_BACKOFF[1]:
            self.backoff = JETSTREAM_HEAL_BACKOFF[0]  # (the last heal is long past)
        earliest = self.healed_at + self.backoff if self.healed_at is not None else now
        store = self.store
        where = f" once {escape(str(store))} has room again" if store is not None else ""
        self.say(
            nats.name,
            f"[bold red]JetStream cannot write its streams (it said: {escape(shorten(said, 'nats')[:200])}); "
            f"restarting NATS{where}, which heals them[/]",
        )
        while not self.stopping():
            if time.monotonic() >= earliest and (store is None or room_again(store)):
                break
            await asyncio.sleep(1)
        if self.stopping():
            return
        if self.healed_at is not None:
            self.backoff = min(self.backoff * 2, JETSTREAM_HEAL_BACKOFF[1])
        self.healed_at = time.monotonic()
        free = ""
        with contextlib.suppress(OSError):
            free = f" ({format_size(free_space(store)[0])} free)" if store is not None else ""
        await self.restart(nats, f"restarting NATS to heal JetStream{free}")
