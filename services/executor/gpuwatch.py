"""Watching that jobs on a shared GPU stay inside their memory slice.

A fractional GPU is advertised to the job (GPUYARD_GPU_MEMORY_FRACTION / _BYTES, MPS limits where MPS runs),
but nothing in the driver stops a job that ignores it. So where NVML is present the executor reads every
process's GPU memory (`nvmlDeviceGetComputeRunningProcesses`, through `gpuyard.shared.gpus.nvml`), adds up the processes of each replica (its
session: the replica's process group and everything it started), and compares the sum with the slice.

A replica over its slice raises an alert (`alert.raised`, kind `gpu_memory_over_slice`) at once; under the
node policy `stop` it is stopped once it has stayed over for the grace period, and fails with reason
`gpu_memory_exceeded`; under `warn` it only gets the alert. Back under its slice: `alert.resolved`.

The reader is injectable (tests drive the watch with a fake); without NVML the watch is off and says so once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuyard.shared.gpus.nvml import Nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuProcess:
    """One process's memory on one GPU, as NVML reports it."""

    pid: int
    gpu_index: int
    used_bytes: int


GpuProcessReader = Callable[[], list[GpuProcess]]


class NvmlProcessReader:
    """Reads per-process GPU memory through `gpuyard.shared.gpus.nvml` (the process's one NVML). `error` says why not, when
    it cannot. `nvml`: another NVML (a fake, in tests)."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml: Nvml | None = nvml or Nvml.shared()
        self.error: str | None = None
        if not self.nvml.available:
            self.error = self.nvml.why or "NVML finds no GPU"
            self.nvml = None

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def __call__(self) -> list[GpuProcess]:
        if self.nvml is None:
            return []
        return [
            GpuProcess(pid=p.pid, gpu_index=p.gpu_index, used_bytes=p.used_bytes)
            for p in self.nvml.processes()
            if p.used_bytes is not None  # None: NVML may not tell (e.g. no access to the process)
        ]

    def close(self) -> None:
        self.nvml = None  # (the process's NVML stays open for its other readers)


@dataclass(frozen=True)
class WatchedReplica:
    job_id: str
    attempt: int
    replica: int
    session: int
    """Session id of the replica's processes (the pid of its first process)."""
    slices: dict[int, int]
    """GPU index → bytes of its memory slice."""


@dataclass(frozen=True)
class Overuse:
    job_id: str
    attempt: int
    replica: int
    gpu_index: int
    used_bytes: int
    slice_bytes: int
    since: float

    @property
    def alert_id(self) -> str:
        return f"gpu_memory/{self.job_id}/{self.attempt}/{self.replica}/{self.gpu_index}"


@dataclass
class Verdicts:
    over: list[Overuse] = field(default_factory=list)
    """Newly over their slice: alert now."""
    back: list[Overuse] = field(default_factory=list)
    """Back under their slice (or gone): resolve the alert."""
    stop: list[Overuse] = field(default_factory=list)
    """Over for longer than the grace, policy `stop`: stop the attempt (each attempt once)."""


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


class SliceWatch:
    """The decision half of the watch: pure except for `session_of` and `clock`, both injectable."""

    def __init__(
        self,
        policy: str,
        grace: float,
        slack_bytes: int = 0,
        *,
        session: Callable[[int], int | None] = session_of,
        clock: Callable[[], float] = time.monotonic,
    ):
        if policy not in ("warn", "stop"):
            raise ValueError(f"GPU memory policy must be 'warn' or 'stop', not {policy!r}")
        self.policy = policy
        self.grace = grace
        self.slack = slack_bytes
        self.session = session
        self.clock = clock
        self.over: dict[tuple[str, int, int, int], Overuse] = {}
        self.stopped: set[tuple[str, int]] = set()

    def check(self, usage: list[GpuProcess], replicas: list[WatchedReplica]) -> Verdicts:
        now = self.clock()
        by_session = {r.session: r for r in replicas}
        used: dict[tuple[str, int, int, int], int] = {}
        for proc in usage:
            sid = self.session(proc.pid)
            rep = by_session.get(sid) if sid is not None else None
            if rep is None or proc.gpu_index not in rep.slices:
                continue
            key = (rep.job_id, rep.attempt, rep.replica, proc.gpu_index)
            used[key] = used.get(key, 0) + proc.used_bytes
        verdicts = Verdicts()
        limits = {
            (r.job_id, r.attempt, r.replica, gpu): size for r in replicas for gpu, size in r.slices.items()
        }
        for key, total in used.items():
            limit = limits[key]
            if total <= limit + self.slack:
                continue
            known = self.over.get(key)
            if known is None:
                known = Overuse(*key, used_bytes=total, slice_bytes=limit, since=now)
                self.over[key] = known
                verdicts.over.append(known)
            attempt = key[:2]
            if self.policy == "stop" and now - known.since >= self.grace and attempt not in self.stopped:
                self.stopped.add(attempt)
                verdicts.stop.append(Overuse(*key, used_bytes=total, slice_bytes=limit, since=known.since))
        for key in [k for k in self.over if k not in used or used[k] <= limits.get(k, 0) + self.slack]:
            verdicts.back.append(self.over.pop(key))
        return verdicts

    def forget(self, job_id: str, attempt: int) -> None:
        self.stopped.discard((job_id, attempt))
