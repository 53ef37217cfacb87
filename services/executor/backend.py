"""What the executor asks of a backend that runs replicas: local process groups, Kubernetes pods or Slurm batch
jobs.

The executor (executor.py) owns the job's lifecycle, identically for every backend: which placements to launch,
the events it records (started, replica exits, succeeded / failed / cancelled / requeued), retries with
backoff, timeouts, stopping on cancel or preemption, the GPU memory watch. A backend only:

- `launch`es the replicas of an attempt it is given and reports, through `BackendEvents`, when they have
  started and how each one ended (`exits.replica_exit`, the `job.replica_exited` event: exit code, signal, reason, message, last log lines);
- `stop`s an attempt: every replica still running ends (SIGTERM, then SIGKILL after the grace) and is
  reported ended like any other;
- writes each replica's output to its log file in the data directory (size-capped, rotated), which the
  submit API serves: logs never travel on the bus;
- after an executor restart, `adopt`s an attempt it can still watch, or says it cannot (the executor then
  records the attempt lost and the scheduler requeues it), after making sure nothing of it still runs;
- says which `nodes` the executor announces to the scheduler: its own (local processes) or the cluster's
  GPU nodes (Kubernetes, Slurm).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from gpuyard.services.executor.exits import AttemptKey, replica_exit
from gpuyard.shared.contracts.events.jobs import FailureReason, JobReplicaExited, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec


@dataclass(frozen=True)
class AttemptLaunch:
    """One attempt to start: the job, all its placements, and which of them this executor runs."""

    job_id: str
    job_name: str
    tenant: str
    attempt: int
    spec: JobSpec
    placements: list[ReplicaPlacement]
    replicas: list[int]
    """The replicas this executor launches (those placed on its node; all of them for Kubernetes)."""
    master_addr: str
    master_port: int

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    def placement(self, replica: int) -> ReplicaPlacement:
        return next(p for p in self.placements if p.replica == replica)

    def start_failed(self, message: str) -> JobReplicaExited:
        """The attempt could not start (a backend's refusal): its first replica's exit, with the reason."""
        first = self.replicas[0]
        return replica_exit(
            self.job_id,
            self.attempt,
            first,
            self.placement(first).node,
            reason=FailureReason.START_FAILED,
            message=message,
        )


class BackendEvents(Protocol):
    """The executor's side: what a backend reports. Both calls may repeat (they are recorded idempotently)."""

    async def replicas_started(self, key: AttemptKey, node: str, replicas: list[int]) -> None: ...

    async def replica_ended(self, ended: JobReplicaExited) -> None: ...


class NotOpened:
    """A backend's events before `Backend.open` gave it the executor's: a report then is a mistake."""

    async def replicas_started(self, key: AttemptKey, node: str, replicas: list[int]) -> None:
        raise RuntimeError("a backend reports once it has been opened (Backend.open)")

    async def replica_ended(self, ended: JobReplicaExited) -> None:
        raise RuntimeError("a backend reports once it has been opened (Backend.open)")


class Backend(ABC):
    name: str
    runs_every_node: bool = False
    """True when one executor runs the replicas of every node (Kubernetes), not only its own node's."""

    @abstractmethod
    async def open(self, events: BackendEvents) -> None:
        """Start watching (called once, before any launch)."""

    @abstractmethod
    async def launch(self, launch: AttemptLaunch) -> JobReplicaExited | None:
        """Start `launch.replicas`. On a failure to start one, what already started is stopped (and not
        reported) and the replica that could not start is returned, as its exit (with the reason)."""

    @abstractmethod
    async def stop(self, key: AttemptKey, grace: float) -> None:
        """End every replica of the attempt still running: SIGTERM (or pod deletion), SIGKILL after `grace`.
        Each one is reported through `replica_ended`."""

    @abstractmethod
    async def adopt(self, key: AttemptKey, replicas: dict[int, str], *, unannounced: bool = False) -> bool:
        """After a restart, for an attempt that was running (`replicas`: replica → node): True when its
        replicas are watched again (their ends will be reported, those that ended meanwhile included);
        False when they cannot be, after making sure none of them still runs. `unannounced`: their start
        was never recorded (its executor died first): reported through `replicas_started` before any end."""

    async def stop_leftovers(self, wanted: Callable[[AttemptKey], Awaitable[bool]]) -> list[AttemptKey]:
        """After a restart: stop what still runs on this node of attempts no executor watches (the node was
        lost meanwhile: they were requeued and placed elsewhere, or ended) that are not `wanted` here any more;
        the attempts stopped. (Kubernetes: none, every pod is the job's current one or released.)"""
        return []

    async def run(self) -> None:  # noqa: B027 (optional: nothing to watch by default)
        """What the backend needs to keep running while the executor serves; returns only if it cannot go on
        (raises then: the executor stops, and its next start adopts what runs)."""

    def started_before(self, key: AttemptKey) -> bool:
        """Whether an earlier executor may have started this attempt, so that launching it again could run
        it twice. (Kubernetes: never a risk, a repeated launch creates nothing twice.)"""
        return False

    async def release(self, key: AttemptKey) -> None:  # noqa: B027 (optional: nothing to release by default)
        """The attempt is over: free what it still holds (Kubernetes: its pods and Service)."""

    async def nodes(self, own: NodeHeartbeat) -> list[NodeHeartbeat]:
        """The nodes the executor announces this round, one heartbeat each. `own` is the executor's own
        node (its GPUs, CPUs, memory, address): what a backend running replicas on this machine announces.
        A backend that runs every node's replicas (Kubernetes) lists its nodes instead; an exception means
        they could not be listed (the executor announces nothing that round)."""
        return [own]

    def note(self, key: AttemptKey, line: str) -> None:  # noqa: B027 (optional: no output to write to)
        """Write `line` (the platform's word, e.g. an idle warning) into the output of the attempt's replicas
        running here, as its own line. (Kubernetes: not done, a pod's output is its own.)"""

    def isolation(self, key: AttemptKey) -> str:
        """How the attempt's replicas that started here are kept from other tenants' jobs (their temporary
        folders, /proc), in plain words, for its `job.started`; "" when the backend does not say (Kubernetes:
        a pod's own)."""
        return ""

    def notes(self, key: AttemptKey) -> list[str]:
        """What the node could not do for the attempt's replicas that started here, besides their limits (a
        volume's read-only mount it could not enforce), in plain words, for its `job.started`."""
        return []

    def sessions(self, key: AttemptKey) -> dict[int, int]:
        """Replica → session id of its processes on this host, for the GPU memory watch ({} when unknown)."""
        return {}

    @property
    def limits(self) -> str:
        """How CPU and memory limits are enforced, in plain words (or that they are not)."""
        return ""

    @abstractmethod
    async def close(self, grace: float, *, stop_jobs: bool = True) -> None:
        """The executor stops. With `stop_jobs` (a deliberate stop: Ctrl-C, `gpuyard up`'s stop), what would
        outlive it unattended (local processes) is stopped without being reported, and a restarted executor
        records it lost; without (a restart, an upgrade), it keeps running and the next executor adopts it.
        Kubernetes pods always keep running and are adopted."""


async def poll_forever(
    poll: Callable[[], Awaitable[None]], interval: float, failed: str, log: logging.Logger
) -> None:
    """`poll` (a read of the engine: Kubernetes' pods, Slurm's queue), then again every `interval` seconds, until
    cancelled. A read that fails is logged (`failed`: what could not be read) and tried again at the next
    interval: an engine away for a while must not stop the executor."""
    while True:
        try:
            await poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: %s", failed, exc)
        await asyncio.sleep(interval)
