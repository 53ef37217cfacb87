"""The serve jobs placed on this node: their replicas are ONNX Runtime sessions this serving service holds
(docs/architecture.md, "Model deployments"), recorded as the executor records a command's attempt.

- `job.placed` of a serve job on this node: the version is read from the model store, its checksum checked,
  and loaded on `CUDAExecutionProvider` on the placement's GPU when ONNX Runtime offers it, else on the CPU;
  then `job.started` (through the ledger) and `model.ready` (this service's endpoint, the provider, the GPU).
- An artifact that cannot be served (a checksum mismatch, a graph ONNX Runtime refuses, a version no longer
  published): `model.failed` with the reason, and the job fails at once, never retried. A model store that
  cannot be read (a network error) is a replica that could not start: retried like any job's.
- `job.cancel_requested` (undeploy): the session is released (the requests it has queued are answered first),
  then `job.cancelled`. `job.preempted`: released, then `job.requeued` (the scheduler places it again).
  The attempt's end recorded by anyone else (a lost node's requeue): released.
- After a restart (`reconcile`): the serve jobs placed on or running on this node are loaded again; nothing
  is recorded twice (every event this host records has a deterministic id).

When it acts on a job event is the protocol of every host of attempts (`gpuyard.shared.runtime.hosting`, the
executor's too): the bus is not the truth, and a job event is acted on only when the event store holds it."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeGuard

from gpuyard.services.serving.errors import ModelLoadError
from gpuyard.services.serving.held import Held, HeldSessions
from gpuyard.services.serving.runtime import CUDA, OnnxModel, load_onnx
from gpuyard.shared.contracts.events.envelope import EventData, derived_id, make_event
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobCancelled,
    JobFailed,
    JobPlaced,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.models import ExecutionProvider, ModelFailed, ModelReady
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobView, state_values
from gpuyard.shared.contracts.stops import ASKED_STOPS, StopReason
from gpuyard.shared.modelfiles import store as modelstore
from gpuyard.shared.runtime.hosting import AttemptHost, StopRequest
from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.stores.events import ConcurrencyError
from gpuyard.shared.stores.ledger import JobLedger, Outcome
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog

log = logging.getLogger(__name__)

# model.failed reasons (for machines)
CHECKSUM_MISMATCH = "checksum_mismatch"
INVALID_MODEL = "invalid_model"
NOT_PUBLISHED = "not_published"
STORE_UNAVAILABLE = "store_unavailable"
NO_RUNTIME = "no_runtime"


class LoadFailure(Exception):
    """The version cannot be served; `retry`: the cause may pass (the store could not be read)."""

    def __init__(self, reason: str, message: str, *, retry: bool = False):
        super().__init__(message)
        self.reason, self.message, self.retry = reason, message, retry


class Host(AttemptHost):
    def __init__(
        self,
        service,
        *,
        node: str,
        endpoint: str,
        sessions: HeldSessions,
        catalog: ModelCatalog,
        cache_dir: Path,
        retry_backoff: float = 5.0,
        intra_op_threads: int = 1,
        loader: Callable[..., OnnxModel] = load_onnx,
    ):
        self.service = service
        self.ledger: JobLedger = service.ledger
        self.node = node
        self.endpoint = endpoint
        self.sessions = sessions
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.retry_backoff = retry_backoff
        self.intra_op_threads = intra_op_threads
        self.loader = loader

    # ------------------------------------------------------------------ the hosting protocol (hosting.py)

    def places_here(self, placements: Sequence[ReplicaPlacement]) -> bool:
        return any(p.node == self.node for p in placements)

    def hosts(self, view: JobView) -> bool:
        """Whether the job's replica is the serving service's: a serve job's."""
        return view.spec.serve is not None

    def holds(self, job_id: str, attempt: int) -> bool:
        held = self.sessions.get(job_id)
        return held is not None and held.attempt == attempt

    def holds_job(self, job_id: str) -> bool:
        return self.sessions.holds_job(job_id)

    async def on_placed(self, placed: JobPlaced, view: JobView) -> None:
        if view.attempt == placed.attempt:
            await self.take_on(view)

    async def on_stop_requested(self, stop: StopRequest) -> None:
        await self.stop(stop.view, stop.why)

    async def on_attempt_ended(self, job_id: str, attempt: int) -> None:
        held = self.sessions.get(job_id)
        if held is not None and held.attempt == attempt:
            await self.release(held, StopReason.ENDED)

    def mine(self, view: JobView) -> bool:
        return self.places_here(view.placements)

    # ------------------------------------------------------------------ taking a replica on

    async def take_on(self, view: JobView) -> None:
        """Load the serve job's version and announce it, unless this node holds it already (a redelivered
        placement, a restart's reconciliation) or it is no longer this node's to hold."""
        serve = view.spec.serve
        if serve is None or view.state not in ACTIVE_STATES or not self.mine(view):
            return
        old = self.sessions.get(view.job_id)
        if old is not None:
            if old.attempt == view.attempt:
                return
            await self.release(old, StopReason.ENDED)  # an older attempt's, whose end was not seen here
        if view.cancel_requested:
            await self.settle(view.job_id, view.attempt, StopReason.CANCELLED)
            return
        placement = next(p for p in view.placements if p.node == self.node)
        held = Held(
            job_id=view.job_id,
            attempt=view.attempt,
            tenant=serve.tenant or view.tenant,
            name=serve.model,
            version=serve.version,
            replica=placement.replica,
            gpu=placement.gpus[0].index if placement.gpus else None,
        )
        if not self.sessions.begin(held):
            return
        try:
            model = await self.load(held)
        except LoadFailure as failure:
            await self.sessions.release(held)
            if held.stop in ASKED_STOPS:  # stopped while it loaded: that is how it ends
                await self.settle(held.job_id, held.attempt, held.stop)
            else:
                await self.failed(held, failure)
            return
        except BaseException:
            await self.sessions.release(held)
            raise
        if held.stop is not None or self.sessions.get(held.job_id) is not held:
            await self.sessions.release(held)  # stopped while it loaded
            if held.stop in ASKED_STOPS:
                await self.settle(held.job_id, held.attempt, held.stop)
            return
        self.sessions.serve(held, model)
        await self.started(held, model)

    async def load(self, held: Held) -> OnnxModel:
        """The version's session: its file from the model store, checked against its published sha256."""
        view = await self.catalog.get(held.tenant, held.name)
        published = view.find(held.version) if view is not None else None
        if published is None:
            raise LoadFailure(
                NOT_PUBLISHED, f"model {held.name} of tenant {held.tenant} has no version {held.version}"
            )
        try:
            path = await asyncio.to_thread(
                modelstore.load_to, published.uri, published.sha256, self.cache_dir
            )
            return await asyncio.to_thread(
                self.loader,
                path,
                sha256=published.sha256,
                gpu=held.gpu,
                intra_op_threads=self.intra_op_threads,
            )
        except modelstore.ChecksumMismatch as exc:
            raise LoadFailure(CHECKSUM_MISMATCH, str(exc)) from None
        except modelstore.ModelStoreError as exc:
            raise LoadFailure(STORE_UNAVAILABLE, str(exc), retry=True) from None
        except ImportError as exc:  # the node, not the model: another placement may do
            raise LoadFailure(
                NO_RUNTIME,
                f"ONNX Runtime is not installed on node {self.node} ({install_command('serving')}; on GPU nodes "
                f"{install_command('gpu')} instead): {exc}",
                retry=True,
            ) from None
        except ModelLoadError as exc:
            reason = CHECKSUM_MISMATCH if "sha256 mismatch" in str(exc) else INVALID_MODEL
            raise LoadFailure(reason, str(exc)) from None

    # ------------------------------------------------------------------ what it records

    async def started(self, held: Held, model: OnnxModel) -> None:
        cuda = model.provider == CUDA
        device = held.gpu if cuda else None
        where = f"{model.provider} on GPU {device}" if cuda else model.provider
        started = JobStarted(
            job_id=held.job_id,
            attempt=held.attempt,
            node=self.node,
            replicas=[held.replica],
            notes=[f"model {held.name}:{held.version} served on {where}"],
        )
        event_id = derived_id(held.job_id, held.attempt, "started", self.node, str(held.replica))
        outcome = await written(lambda: self.ledger.append(held.job_id, started, event_id=event_id))
        if outcome.refused is not None:  # ended meanwhile (cancelled, requeued): its end event releases it
            log.info("job %s attempt %d: not started (%s)", held.job_id, held.attempt, outcome.refused)
            return
        log.info("job %s: serving %s:%d on %s", held.job_id, held.key, held.version, where)
        ready = ModelReady(
            name=held.name,
            tenant=held.tenant,
            version=held.version,
            job_id=held.job_id,
            node=self.node,
            endpoint=self.endpoint,
            provider=ExecutionProvider(model.provider),
            device=device,
        )
        await self.announce(
            ready, derived_id(held.job_id, held.attempt, Subject.MODEL_READY.value, self.node)
        )

    async def failed(self, held: Held, failure: LoadFailure) -> None:
        log.warning("job %s: cannot serve %s:%d: %s", held.job_id, held.key, held.version, failure.message)
        await self.announce(
            ModelFailed(
                name=held.name,
                tenant=held.tenant,
                version=held.version,
                job_id=held.job_id,
                node=self.node,
                reason=failure.reason,
                message=failure.message,
            ),
            derived_id(held.job_id, held.attempt, Subject.MODEL_FAILED.value, self.node),
        )
        job_id, attempt = held.job_id, held.attempt
        message = f"{failure.reason}: {failure.message}"
        if failure.retry:  # a replica that could not start: retried (with backoff) up to max_retries
            exited = JobReplicaExited(
                job_id=job_id,
                attempt=attempt,
                node=self.node,
                replica=held.replica,
                reason=FailureReason.START_FAILED,
                message=message,
            )
            await written(
                lambda: self.ledger.record(
                    job_id,
                    lambda _view: exited,
                    event_id=lambda _view: derived_id(job_id, attempt, "exited", held.replica),
                    then=lambda view: retry_or_fail(view, attempt, message, self.retry_backoff),
                    then_id=lambda _view: derived_id(job_id, attempt, "ended"),
                )
            )
            return
        failed = JobFailed(
            job_id=job_id,
            attempt=attempt,
            reason=FailureReason.START_FAILED,
            message=message,
            replica=held.replica,
        )
        await written(
            lambda: self.ledger.record(
                job_id,
                lambda view: failed if current(view, attempt) else None,
                event_id=lambda _view: derived_id(job_id, attempt, "ended"),
            )
        )

    async def announce(self, data: ModelReady | ModelFailed, event_id: str) -> None:
        """Publish a model event (not a job's: the event store does not keep it). Its id is deterministic, so
        JetStream drops a repeat; a failed publish is logged (the other nodes then do not route to it)."""
        try:
            await self.service.bus.publish(make_event(data, source=self.service.source, id=event_id))
        except Exception as exc:
            log.warning("publish of %s for job %s failed: %s", data.subject, data.job_id, exc)

    # ------------------------------------------------------------------ stopping

    async def stop(self, view: JobView, why: StopReason) -> None:
        """Cancel or preempt this node's replica of the job: release it, then record how the attempt ended."""
        held = self.sessions.get(view.job_id)
        if held is not None and held.attempt == view.attempt:
            if held.model is None:  # still loading: the loader settles it
                held.stop = held.stop or why
                return
            await self.release(held, why)
        elif why != StopReason.CANCELLED or view.state not in ACTIVE_STATES:
            return  # (a cancel of a replica not taken on here is settled here all the same)
        await self.settle(view.job_id, view.attempt, why)

    async def release(self, held: Held, why: StopReason) -> None:
        held.stop = held.stop or why
        if held.model is None:
            return  # loading: the loader sees `stop`
        await self.sessions.release(held)
        log.info("job %s: released %s:%d (%s)", held.job_id, held.key, held.version, why)

    async def settle(self, job_id: str, attempt: int, why: StopReason) -> None:
        await written(
            lambda: self.ledger.record(
                job_id,
                lambda view: stopped(view, attempt, why),
                event_id=lambda _view: derived_id(job_id, attempt, "ended"),
            )
        )

    # ------------------------------------------------------------------ after a restart

    async def reconcile(self) -> None:
        """Take on again the serve jobs placed on or running on this node (after a restart, or placed before
        the consumers existed)."""
        cursor = None
        while True:
            page = await self.service.store.list_projections(
                states=state_values(ACTIVE_STATES), limit=500, cursor=cursor
            )
            for doc in page.items:
                try:
                    view = JobView.model_validate(doc)
                    if view.spec.serve is not None and self.mine(view):
                        await self.take_on(view)
                except Exception:  # one job it cannot read or load never stops it serving others
                    log.exception("job %s: cannot be reconciled; left as it is", doc.get("job_id", "?"))
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def close(self) -> None:
        await self.sessions.close()


def current(view: JobView | None, attempt: int) -> TypeGuard[JobView]:
    return view is not None and view.attempt == attempt and view.state in ACTIVE_STATES


def stopped(view: JobView | None, attempt: int, why: StopReason) -> EventData | None:
    """How an attempt this host stopped ends: cancelled (undeployed), or requeued when preempted (the scheduler
    places it again); None when it is no longer this attempt's to say."""
    if not current(view, attempt):
        return None
    if why == StopReason.CANCELLED or view.cancel_requested:
        return JobCancelled(job_id=view.job_id, attempt=attempt, by="serving", message="undeployed")
    if why == StopReason.PREEMPTED:
        reason = view.preempt_requested.text if view.preempt_requested else StopReason.PREEMPTED.value
        return JobRequeued(
            job_id=view.job_id, attempt=attempt + 1, reason=RequeueReason.PREEMPTED, message=reason
        )
    return None


def retry_or_fail(view: JobView | None, attempt: int, message: str, backoff: float) -> EventData | None:
    """A replica that could not start: retried after the backoff (doubling each attempt) while the job has
    retries left, else failed (as the executor decides for a command's replica)."""
    if not current(view, attempt):
        return None
    if view.cancel_requested:
        return JobCancelled(job_id=view.job_id, attempt=attempt, by="serving", message="undeployed")
    if attempt <= view.spec.max_retries:
        return JobRequeued(
            job_id=view.job_id,
            attempt=attempt + 1,
            reason=RequeueReason.RETRY,
            message=f"retry {attempt}/{view.spec.max_retries} after: {message}",
            not_before=datetime.now(UTC) + timedelta(seconds=backoff * 2 ** (attempt - 1)),
        )
    return JobFailed(
        job_id=view.job_id, attempt=attempt, reason=FailureReason.START_FAILED, message=message, replica=0
    )


async def written(write: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """`write()` until the ledger stores it (or finds it stored, or refuses it): other processes' writes to
    the job (the scheduler's, the API's) may land first; each conflict is decided again after a moment."""
    while True:
        try:
            return await write()
        except ConcurrencyError as exc:
            log.info("%s; writing again", exc)
            await asyncio.sleep(random.uniform(0.01, 0.1))
