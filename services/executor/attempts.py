"""The attempts an executor holds: one record per attempt, in one registry.

A record is opened when this executor takes an attempt on (a placement it claims, or an attempt it adopts
after a restart) and closed when the attempt's end is seen (`job.succeeded`, `failed`, `cancelled`,
`requeued`: every executor of the job sees it), or at once when the placement turns out stale. So the
registry holds the attempts in flight on this node and nothing else, however many jobs the node has run: what
keeps a redelivered placement from starting an attempt twice once it is over is the job's state in the store.

The record is where everything per attempt lives: what was launched, which replicas still run, why and with
what grace it is being stopped, its timeout timer. Long-running replicas (a model server of a serving
deployment) are records like any other, without a timer, held until their deployment stops them; an attempt
adopted after a restart is opened by the executor's reconciliation with the replicas still running (and
those whose exits its reaper wrote meanwhile are reported ended by the backend, like any other end).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuyard.services.executor.backend import AttemptLaunch
from gpuyard.services.executor.exits import AttemptKey
from gpuyard.shared.contracts.stops import StopReason


@dataclass(slots=True, eq=False)
class Attempt:
    key: AttemptKey
    launch: AttemptLaunch | None = None
    """What this executor starts (or watches again) of the attempt; None until known."""
    running: set[int] = field(default_factory=set)
    """Its replicas started (or adopted) here that have not ended yet."""
    stop_reason: StopReason | None = None
    """Why the executor stops it: the first reason given wins, and says how the attempt ends."""
    stop_grace: float | None = None
    stop_message: str = ""
    """The cause in plain words, where the stop's reason alone does not say it (a GPU memory overrun)."""
    timer: asyncio.Task | None = None
    """Stops the attempt when its spec's timeout has passed."""
    over: bool = False
    """Its end was seen (the record is closed): a launch still in progress stops what it started."""

    def stopping(self, reason: StopReason, grace: float) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.stop_grace = reason, grace

    def cancel_timer(self) -> None:
        timer, self.timer = self.timer, None
        if timer is not None and timer is not asyncio.current_task():  # (a timeout's stop may end here)
            timer.cancel()


class Attempts:
    """The registry: the attempts this executor holds, by key."""

    __slots__ = ("_held", "_jobs")

    def __init__(self) -> None:
        self._held: dict[AttemptKey, Attempt] = {}
        self._jobs: dict[str, int] = {}  # job id -> how many of its attempts are held

    def open(self, key: AttemptKey) -> Attempt | None:
        """A new record for the attempt; None when this executor already holds it."""
        if key in self._held:
            return None
        record = self._held[key] = Attempt(key)
        self._jobs[key.job_id] = self._jobs.get(key.job_id, 0) + 1
        return record

    def holds_job(self, job_id: str) -> bool:
        """Whether this executor holds an attempt of the job."""
        return job_id in self._jobs

    def get(self, key: AttemptKey) -> Attempt | None:
        return self._held.get(key)

    def close(self, record: Attempt) -> None:
        """The attempt is over here: forget it (its timer stops; a launch in progress sees `over`)."""
        record.over = True
        record.cancel_timer()
        if self._held.get(record.key) is record:
            del self._held[record.key]
            left = self._jobs.pop(record.key.job_id) - 1
            if left:
                self._jobs[record.key.job_id] = left

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Attempt]:
        return iter(self._held.values())
