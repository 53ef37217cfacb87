"""TCP ports ahead of the processes that will bind them: free ones picked for `gpuyard up`'s service /metrics
and health ports and for the test suite's and benchmarks' platforms; and the check `gpuyard up` makes of every
port it will have bound before it starts anything (`conflict`), so that a port in use is one line at once, not a
service crash-looping behind a banner that says the platform is up.

A port picked by binding port 0 comes from the kernel's ephemeral range, where any socket bound to port 0 in
the meantime (a service's health endpoint, an outgoing connection) may take it before its owner binds it: a
platform whose API port went to an executor's health endpoint that way crash-looped its submit service. Ports
are therefore picked below that range, where the kernel never hands one out by itself.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass

ANY_ADDRESS = ("0.0.0.0", "::", "")
LOWEST = 10_000
"""The lowest port picked (below it, the well-known and registered services' usual ports)."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports bound to 0 (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(host: str, n: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """`n` different ports free on `host` now, below the kernel's ephemeral range (in it only when the range
    leaves too little room below), none of `avoid` (ports named for what is not bound yet): every socket stays
    bound until all are picked."""
    low, _high = ephemeral_range()
    with contextlib.ExitStack() as stack:
        picked: list[int] = []
        tries = 0
        while len(picked) < n:
            s = stack.enter_context(socket.socket())
            port = random.randrange(LOWEST, low) if low - LOWEST >= 1000 and tries < 50 * n else 0
            tries += 1
            if port in avoid:
                continue
            try:
                s.bind((host, port))
            except OSError:
                continue
            if s.getsockname()[1] in avoid:
                continue
            picked.append(s.getsockname()[1])
        return picked


def loopback_for(host: str) -> str:
    """Where a process of this machine reaches a socket bound to `host` (an any-address: the loopback)."""
    return "127.0.0.1" if host in ANY_ADDRESS else host


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


@dataclass(frozen=True)
class Wanted:
    """A port a process of the platform will listen on, and what to tell the user when it cannot."""

    what: str
    """What listens there: `the API`, `the health endpoints of executor-1`."""
    host: str
    port: int
    source: str
    """What set it: `gpuyard up`'s flag (`--serving-port`), a variable (`GPUYARD_HEALTH_PORT`), or `gpuyard up`
    itself (`a port gpuyard up picked`)."""
    remedy: str
    """What the user can do about it: `pass --serving-port`."""


def _overlap(a: Wanted, b: Wanted) -> bool:
    """Whether both cannot listen at once: one port on one address, or on every address and one of them."""
    return a.port == b.port and (a.host == b.host or a.host in ANY_ADDRESS or b.host in ANY_ADDRESS)


def conflict(wanted: Sequence[Wanted]) -> str | None:
    """Why the ports `wanted` cannot all be bound now, as the one line to show: two of them on one port, or
    one in use by another process; None when every one of them is free."""
    for i, a in enumerate(wanted):
        for b in wanted[i + 1 :]:
            if not _overlap(a, b):
                continue
            if a.source == b.source:
                return f"{a.source} is {a.port} for both {a.what} and {b.what}: {a.remedy}"
            return f"{a.source} and {b.source} are both {a.port}: {a.what} and {b.what} need a port each"
    for w in wanted:
        if not port_free(w.host, w.port):
            return f"port {w.port} for {w.what} is in use on {w.host}: stop what uses it or {w.remedy}"
    return None
