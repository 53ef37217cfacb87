"""Free TCP ports picked ahead of the process that will bind them: `gpuyard up`'s service /metrics ports, and
the test suite's and benchmarks' platforms.

A port picked by binding port 0 comes from the kernel's ephemeral range, where any socket bound to port 0 in
the meantime (a service's health endpoint, an outgoing connection) may take it before its owner binds it: a
platform whose API port went to an executor's health endpoint that way crash-looped its submit service. Ports
are therefore picked below that range, where the kernel never hands one out by itself.
"""

from __future__ import annotations

import contextlib
import random
import socket

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


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False
