"""The processes a platform runs, read from /proc: a process's children (those of each of its threads), their
children, and which of them run one of the platform's services. A thread or a process that ends while it is
read is passed over (its children are reparented or gone), never an error: the tests that read these kill and
restart processes, and the supervisor's threads come and go."""

from __future__ import annotations

import contextlib
from pathlib import Path


def children(pid: int) -> set[int]:
    """`pid`'s child processes now (none once it is gone)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
                found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def descendants(pid: int) -> set[int]:
    """`pid`'s children, theirs, and so on."""
    found = children(pid)
    for child in list(found):
        found |= descendants(child)
    return found


def service_processes(up: int, service: str) -> list[int]:
    """The processes of one of the platform's services (`executor`, `monitor`...) that `gpuyard up` (`up`)
    runs now, in pid order."""
    found = []
    for pid in sorted(children(up)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # (it ended meanwhile)
            continue
        if f"gpuyard.services.{service}".encode() in argv:
            found.append(pid)
    return found
