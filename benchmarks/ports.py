"""Free TCP ports for the benchmarks' own servers, so that two runs on one machine never collide."""

from __future__ import annotations

import contextlib
import socket


def free_ports(n: int) -> list[int]:
    """`n` different ports free now on 127.0.0.1: every socket stays bound until all are picked (closed one
    by one, the kernel may hand out the same port twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
