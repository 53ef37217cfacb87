"""Bytes moved from a socket to a file by the kernel (Linux's `splice`, through a pipe): never copied into the
program. What the CLI's downloads (`gpuyard/rawhttp.py`) and the API's uploads into a volume
(`services/submit/rawbody.py`) take a large body with; for gigabytes, copying each chunk through Python is most
of a transfer's time."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable

PIPE_SIZE = 1 << 20
"""The pipe the bytes go through: bytes moved by one `os.splice`."""
SPLICE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
"""Whether the kernel can move a socket's bytes to a file itself (Linux)."""


class EndedEarly(ConnectionError):
    """The socket ended before the bytes it was to bring."""


def splice_exactly(
    source: int,
    fd: int,
    count: int,
    moved: Callable[[int], None] = lambda n: None,
    readable: Callable[[], None] | None = None,
) -> None:
    """`count` bytes moved from the socket `source` to the open file `fd`, `moved(n)` told after each step.
    `readable`: for a non-blocking socket, called when it has nothing yet; it returns once it has (or raises).
    EndedEarly for a socket that ends before `count` bytes."""
    left = count
    pipe_out, pipe_in = os.pipe()
    try:
        with contextlib.suppress(OSError):  # (a larger pipe: fewer calls; the default where refused)
            fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        while left:
            try:
                n = os.splice(source, pipe_in, min(left, PIPE_SIZE))
            except BlockingIOError:
                if readable is None:
                    raise
                readable()
                continue
            if n == 0:
                raise EndedEarly(f"the connection ended {left} bytes before the body's length")
            left -= n
            in_pipe = n
            while in_pipe:
                in_pipe -= os.splice(pipe_out, fd, in_pipe)
            moved(n)
    finally:
        os.close(pipe_in)
        os.close(pipe_out)
