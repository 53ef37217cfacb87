"""Which running replicas of a node use which job environment: one empty file each,
`<root>/.in-use/<key>/<job id>.<attempt>.<replica>`, made before the replica starts and removed when it ends.
Every executor process of the node sees them (a removal by one never takes an environment another one's replica
runs in), and a restarted executor finds them. A mark whose replica is gone without its end seen (its pid file
removed, the executor down meanwhile) is dropped once it is older than GRACE_SECONDS: the start of a replica
makes its pid file within them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from gpuyard.services.executor.exits import AttemptKey

IN_USE = ".in-use"
GRACE_SECONDS = 120.0

Replica = tuple[AttemptKey, int]
Alive = Callable[[str, int, int], bool]
"""Whether a replica (job id, attempt, replica) may still run on the node: its pid file is there."""


def _name(user: Replica) -> str:
    (job_id, attempt), replica = user
    return f"{job_id}.{attempt}.{replica}"


class InUseMarks:
    def __init__(self, root: Path, alive: Alive):
        self.folder = root / IN_USE
        self.alive = alive

    def mark(self, key: str, user: Replica) -> None:
        folder = self.folder / key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _name(user)).touch()

    def unmark(self, user: Replica) -> None:
        """The replica ended: its mark goes, whichever environment it was in."""
        name = _name(user)
        with contextlib.suppress(OSError):
            for key in os.listdir(self.folder):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.folder / key / name)

    def count(self, key: str, now: float | None = None) -> int:
        """The replicas using the environment now (stale marks dropped)."""
        folder = self.folder / key
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return 0
        now = time.time() if now is None else now
        live = 0
        for name in names:
            job_id, _, rest = name.partition(".")
            attempt, _, replica = rest.partition(".")
            try:
                young = now - os.stat(folder / name).st_mtime < GRACE_SECONDS
            except FileNotFoundError:
                continue
            if young or (
                attempt.isdigit() and replica.isdigit() and self.alive(job_id, int(attempt), int(replica))
            ):
                live += 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)
        return live

    def used(self) -> dict[str, int]:
        """Key → replicas using it, for every environment in use."""
        try:
            keys = os.listdir(self.folder)
        except FileNotFoundError:
            return {}
        return {key: n for key in keys if (n := self.count(key))}
