"""One process that `gpuyard up` runs (NATS, or a service process), as its supervisor sees it: how it starts,
what became of it, and the signal it gets when the supervisor itself dies (Linux's PR_SET_PDEATHSIG)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuyard.shared.contracts.events.services import ProcessState

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:  # in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def killed_with_parent() -> None:
    """NATS has no stop of its own to finish once the supervisor is gone: it is killed with it."""
    die_with_parent(signal.SIGKILL)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    service: str = ""
    """The service it runs (several executor processes share one); default: its name."""
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    pump: asyncio.Task | None = None
    backoff: float = field(default=1.0)
    quick_exits: int = 0
    """Exits in a row within STABLE_SECONDS of a start: CRASH_LOOP of them is a crash loop."""
    last_line: str = ""
    """What it said last (a refusal's or a crash's reason)."""
    ready: bool = False
    """It said it started (its `… started (pid …)` line)."""
    state: ProcessState = ProcessState.RUNNING
    exit_code: int | None = None
    """How its last exit ended (minus the signal that killed it), while it is not running again."""
    last_error: str | None = None
    """What it said last before that exit, while it is not running again."""
    with_parent: Callable[[], None] = die_with_parent
    """Run in the child before exec: the signal it gets when the supervisor dies (PR_SET_PDEATHSIG)."""
    restarting: bool = False
    """The supervisor itself restarts it (NATS, to heal JetStream): `watch` leaves it alone meanwhile."""
