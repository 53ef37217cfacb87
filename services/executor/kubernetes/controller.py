"""Runs placed jobs as pods and reports what becomes of them. Edge-triggered, restart-tolerant.

- `launch` creates an attempt's objects; every create tolerates AlreadyExists, so a redelivered placement
  (or an executor restarted mid-launch) completes the launch instead of starting the job twice. An attempt
  this controller cancelled is not launched again (it remembers the last 10,000 cancellations, in memory:
  after a restart, the executor's own job state must stop a stale placement).
- `cancel` deletes an attempt's pods and Service; it is also the clean-up call for a finished attempt.
- `poll` lists GPUYARD's pods and returns the replicas whose phase changed since the previous poll. After a
  restart the controller knows nothing, so the first poll reports every running and finished replica once
  more: consumers must treat outcomes as idempotent (events with `derived_id`s do). A replica first seen
  finished whose process did run is reported RUNNING first, so every exit follows a start. A tracked pod
  that disappears without `cancel` is reported FAILED / NODE_LOST.
- `logs` reads a replica's log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuyard.services.executor.classify import classify_log_tail
from gpuyard.services.executor.exits import AttemptKey, ReplicaKey
from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApi, KubeApiError, KubeNotFound
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.manifests import (
    CONTAINER,
    build_job_manifests,
    pod_owner_reference,
    with_owner,
)
from gpuyard.services.executor.kubernetes.outcomes import ReplicaOutcome, ReplicaPhase, pod_outcome
from gpuyard.services.executor.kubernetes.volumecopy import CopiedVolumes
from gpuyard.shared.contracts.events.jobs import FailureReason, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec

log = logging.getLogger(__name__)

RECLASSIFIED_BY_LOG = (FailureReason.EXIT_CODE, FailureReason.SIGNAL)
REMEMBERED_CANCELLATIONS = 10_000


@dataclass(frozen=True)
class LaunchResult:
    created: list[str] = field(default_factory=list)
    """Names of the objects this call created."""
    existing: list[str] = field(default_factory=list)
    """Names that already existed (a redelivered placement)."""
    skipped: bool = False
    """True when the attempt had been cancelled: nothing was created."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class KubernetesController:
    def __init__(
        self, api: KubeApi, config: KubernetesConfig, *, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self._reported: dict[ReplicaKey, ReplicaOutcome] = {}
        self._cancelled: OrderedDict[AttemptKey, None] = OrderedDict()

    @property
    def namespace(self) -> str:
        return self.config.namespace

    # ------------------------------------------------------------------ launch

    async def launch(
        self,
        *,
        job_id: str,
        attempt: int,
        job_name: str,
        tenant: str,
        spec: JobSpec,
        placements: Sequence[ReplicaPlacement],
        claims: Mapping[str, str] | None = None,
        copied: CopiedVolumes | None = None,
    ) -> LaunchResult:
        """`claims`: the claim of each volume the spec mounts, made before (`volumeclaims.py`); `copied`: the
        volumes its pods copy from the object store instead (`volumecopy.py`)."""
        if AttemptKey(job_id, attempt) in self._cancelled:
            log.info("not launching %s attempt %s: it was cancelled", job_id, attempt)
            return LaunchResult(skipped=True)
        manifests = build_job_manifests(
            job_id=job_id,
            attempt=attempt,
            job_name=job_name,
            tenant=tenant,
            spec=spec,
            placements=placements,
            config=self.config,
            claims=claims,
            copied=copied,
        )
        result = LaunchResult()
        first = await self._create(self.api.create_pod, manifests.pods[0], result)
        if first is None:  # created by an earlier delivery: its uid is needed for the owner references
            first = await self.api.read_pod(self.namespace, manifests.pods[0]["metadata"]["name"])
        anchor = pod_owner_reference(first)
        if manifests.service is not None:
            await self._create(self.api.create_service, with_owner(manifests.service, anchor), result)
        limit = asyncio.Semaphore(self.config.create_concurrency)

        async def create_pod(pod: dict[str, Any]) -> None:
            async with limit:
                await self._create(self.api.create_pod, with_owner(pod, anchor), result)

        await asyncio.gather(*(create_pod(pod) for pod in manifests.pods[1:]))
        return result

    async def _create(
        self, create: Callable[..., Any], body: dict[str, Any], result: LaunchResult
    ) -> dict[str, Any] | None:
        """The created object, or None when it already existed."""
        name = body["metadata"]["name"]
        try:
            created = await create(self.namespace, body)
        except KubeAlreadyExists:
            result.existing.append(name)
            return None
        result.created.append(name)
        return created

    # ------------------------------------------------------------------ cancel

    async def cancel(self, job_id: str, attempt: int, *, grace_seconds: int | None = None) -> int:
        """Deletes the attempt's pods and Service; the number of pods deleted. Later outcomes are not reported."""
        self._remember_cancelled(AttemptKey(job_id, attempt))
        for key in [k for k in self._reported if k[:2] == (job_id, attempt)]:
            del self._reported[key]
        selector = job_labels.selector_string(job_labels.attempt_selector(job_id, attempt))
        deleted = await self.api.delete_pods(self.namespace, selector, grace_seconds)
        await self.api.delete_services(self.namespace, selector)
        return deleted

    def _remember_cancelled(self, attempt: AttemptKey) -> None:
        self._cancelled[attempt] = None
        self._cancelled.move_to_end(attempt)
        while len(self._cancelled) > REMEMBERED_CANCELLATIONS:
            self._cancelled.popitem(last=False)

    # ------------------------------------------------------------------ poll

    async def poll(self) -> list[ReplicaOutcome]:
        pods = await self.api.list_pods(
            self.namespace, job_labels.selector_string(job_labels.managed_selector())
        )
        now = self.clock()
        changes: list[ReplicaOutcome] = []
        present: set[ReplicaKey] = set()
        for pod in pods:
            outcome = pod_outcome(pod, now=now, start_timeout=self.config.start_timeout_seconds)
            if outcome is None:
                continue
            key = (outcome.job_id, outcome.attempt, outcome.replica)
            present.add(key)
            if key[:2] in self._cancelled:
                self._reported.pop(key, None)
                continue
            changes.extend(await self._transition(key, outcome))
        changes.extend(self._vanished(present))
        return changes

    async def _transition(self, key: ReplicaKey, outcome: ReplicaOutcome) -> list[ReplicaOutcome]:
        known = self._reported.get(key)
        previous = known.phase if known else None
        if previous == outcome.phase or (previous is not None and previous.finished):
            return []
        self._reported[key] = outcome
        if outcome.phase is ReplicaPhase.PENDING:
            return []
        if outcome.phase is ReplicaPhase.FAILED and outcome.container_started:
            outcome = await self._with_log_tail(outcome)
        started_unseen = outcome.phase.finished and previous is not ReplicaPhase.RUNNING
        if started_unseen and outcome.container_started:
            running = outcome.with_(
                phase=ReplicaPhase.RUNNING, exit_code=None, signal=None, reason=None, message="", log_tail=()
            )
            return [running, outcome]
        return [outcome]

    async def _with_log_tail(self, outcome: ReplicaOutcome) -> ReplicaOutcome:
        if not self.config.log_tail_lines:
            return outcome
        try:
            text = await self.api.read_pod_log(
                self.namespace, outcome.pod, CONTAINER, self.config.log_tail_lines
            )
        except KubeApiError as exc:
            log.warning("no log for pod %s: %s", outcome.pod, exc)
            return outcome
        tail = tuple(text.splitlines())
        if outcome.reason in RECLASSIFIED_BY_LOG and classify_log_tail(tail) is FailureReason.CUDA_OOM:
            message = f"CUDA out of memory ({outcome.message})"
            return outcome.with_(reason=FailureReason.CUDA_OOM, message=message, log_tail=tail)
        return outcome.with_(log_tail=tail)

    def _vanished(self, present: set[ReplicaKey]) -> list[ReplicaOutcome]:
        lost = []
        for key in [k for k in self._reported if k not in present]:
            last = self._reported.pop(key)
            if last.phase.finished:
                continue  # cleaned up after it finished: nothing to say
            lost.append(
                last.with_(
                    phase=ReplicaPhase.FAILED,
                    reason=FailureReason.NODE_LOST,
                    message="the pod was deleted outside GPUYARD (node removed, or deleted by hand)",
                )
            )
        return lost

    # ------------------------------------------------------------------ logs

    async def logs(
        self,
        job_id: str,
        attempt: int,
        replica: int,
        tail_lines: int | None = None,
        *,
        container: str = CONTAINER,
    ) -> list[str]:
        """The last `tail_lines` lines (all when None) of a replica's log (of its pod's `container`: the job's, or
        an init container). Raises KubeNotFound."""
        selector = job_labels.selector_string(job_labels.replica_selector(job_id, attempt, replica))
        pods = await self.api.list_pods(self.namespace, selector)
        if not pods:
            raise KubeNotFound(f"no pod for job {job_id} attempt {attempt} replica {replica}")
        name = pods[0]["metadata"]["name"]
        text = await self.api.read_pod_log(self.namespace, name, container, tail_lines)
        return text.splitlines()
