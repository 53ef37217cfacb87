"""Which executor process of a node runs an attempt, when several share the node's placements.

`job.placed` goes to one of them (a durable consumer they share), but a redelivery, a cancel that every one of
them sees, or a restart's reconciliation could make two act on the same attempt. The first to act creates
the attempt's claim, a symbolic link whose target is its worker index (created whole in one call, or refused
when it exists); the others leave the attempt alone. A claim outlives its process: a restarted worker (same
index) finds its own claims and settles them.

With one executor process on the node nothing is written and every claim is its own. An attempt with no
claim that was started before (by a single executor) counts as worker 0's.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.shared.runtime.paths import private_dir, replica_files


class Claims:
    def __init__(self, data_dir: Path, node: str, worker: int, *, shared: bool):
        self.data_dir = data_dir
        self.node = node
        self.worker = worker
        self.shared = shared

    def path(self, key: AttemptKey) -> str:
        return f"{replica_files(self.data_dir, *key, 0).attempt}/executor-{self.node}.claim"

    def take(self, key: AttemptKey) -> bool:
        """Claim the attempt for this worker; False when another worker of the node holds it."""
        if not self.shared:
            return True
        path = self.path(key)
        try:
            os.symlink(str(self.worker), path)  # one call: it appears whole, or fails when a claim exists
        except FileExistsError:
            return self.holder(key) == self.worker
        except FileNotFoundError:  # the attempt's directory comes with its first claim
            private_dir(os.path.dirname(path))
            return self.take(key)
        return True

    def holder(self, key: AttemptKey) -> int | None:
        """The worker that claimed the attempt; None when none did (or only one executor runs here)."""
        if not self.shared:
            return None
        try:
            text = os.readlink(self.path(key))
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def owns(self, key: AttemptKey) -> bool:
        """Whether this worker settles an attempt that was started before it started: its own claim, or no
        claim (started by a single executor) and this is worker 0."""
        holder = self.holder(key)
        return (0 if holder is None else holder) == self.worker
