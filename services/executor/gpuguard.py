"""The GPU slice guard: every `gpu_memory_interval`, the replicas of this executor's attempts that run on a
fractional GPU are checked against their memory slices (`gpuwatch.SliceWatch` decides); an overrun raises an
alert (with the job's tenant and user: who may see it), its end resolves it, and under the node policy `stop`
an attempt that stays over is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gpuyard.services.executor.attempts import Attempts
from gpuyard.services.executor.backend import Backend
from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.gpuwatch import (
    GpuProcessReader,
    NvmlProcessReader,
    Overuse,
    SliceWatch,
    WatchedReplica,
)
from gpuyard.services.executor.jobenv import share_bytes
from gpuyard.services.executor.nodelog import node_log
from gpuyard.shared.contracts.events.alerts import AlertKind, AlertRaised, AlertResolved, AlertSeverity
from gpuyard.shared.contracts.events.envelope import EventData, derived_id, make_event
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.executor import ExecutorSettings

log = logging.getLogger(__name__)
KIND = AlertKind.GPU_MEMORY_OVER_SLICE


def choose_reader(
    settings: ExecutorSettings, *, simulated: bool, has_gpus: bool, given: GpuProcessReader | None
) -> GpuProcessReader | None:
    """What reads the GPU processes' memory on this node; None (said once, with why) where nothing can."""
    if given is not None:
        return given
    why = None
    if settings.gpu_memory_policy == "off":
        why = "turned off (GPUYARD_GPU_MEMORY_POLICY=off)"
    elif simulated or not has_gpus:
        why = "this node has no NVIDIA GPU" + (" (its GPUs are simulated)" if simulated else "")
    elif settings.executor_backend != "local":
        why = "the Kubernetes backend leaves GPU sharing to the device plugin"
    else:
        reader = NvmlProcessReader()
        if reader.available:
            return reader
        why = f"NVML is not available ({reader.error})"
    node_log.info("GPU memory slices are not watched on this node: %s", why)
    return None


class SliceGuard:
    def __init__(
        self,
        service: Service,
        settings: ExecutorSettings,
        *,
        reader: GpuProcessReader | None,
        backend: Backend,
        attempts: Attempts,
        gpu_memory: dict[int, int],
        stop: Callable[[Overuse, str], None],
    ):
        self.service = service
        self.settings = settings
        self.reader = reader
        self.backend = backend
        self.attempts = attempts
        self.gpu_memory = gpu_memory
        self.stop = stop
        """Stops an attempt that stayed over its slice, with the cause in plain words."""
        policy = settings.gpu_memory_policy
        self.watch = SliceWatch(
            "warn" if policy == "off" else policy, settings.gpu_memory_grace, settings.gpu_memory_slack
        )
        self.owners: dict[str, tuple[str | None, str | None]] = {}
        """Alert id -> (tenant, user) of its job, from its raise to its resolve."""

    def watched(self) -> list[WatchedReplica]:
        watched = []
        for record in self.attempts:
            if record.launch is None or not record.running:
                continue
            sessions = self.backend.sessions(record.key)
            for replica in record.running:
                if replica not in sessions:
                    continue
                slices = {
                    g.index: size
                    for g in record.launch.placement(replica).gpus
                    if g.fraction < 1
                    and (size := share_bytes(g.fraction, g.memory_bytes, self.gpu_memory.get(g.index)))
                }
                if slices:
                    watched.append(WatchedReplica(*record.key, replica, sessions[replica], slices))
        return watched

    async def check(self) -> None:
        watched = self.watched()
        if not watched or self.reader is None:
            return
        usage = await asyncio.to_thread(self.reader)
        verdicts = self.watch.check(usage, watched)
        grace = self.settings.gpu_memory_grace
        for over in verdicts.over:
            tenant, user = self.owners[over.alert_id] = await self.owner(over)
            then = (
                f"it is stopped if it stays over for {grace:g}s"
                if self.settings.gpu_memory_policy == "stop"
                else "node policy: warn only"
            )
            message = (
                f"job {over.job_id} replica {over.replica} uses {format_size(over.used_bytes)} of GPU "
                f"{over.gpu_index}, over its slice of {format_size(over.slice_bytes)}; {then}"
            )
            log.warning(message)
            raised = AlertRaised(
                alert_id=over.alert_id,
                kind=KIND,
                severity=AlertSeverity.WARNING,
                message=message,
                node=self.settings.node_name,
                gpu_index=over.gpu_index,
                job_id=over.job_id,
                tenant=tenant,
                user=user,
                value=over.used_bytes,
                threshold=over.slice_bytes,
            )
            await self.publish(raised, derived_id(over.alert_id, "raised", over.since))
        for back in verdicts.back:
            tenant, _ = self.owners.pop(back.alert_id, (None, None))
            resolved = AlertResolved(
                alert_id=back.alert_id, kind=KIND, message="back in its slice", tenant=tenant
            )
            await self.publish(resolved, derived_id(back.alert_id, "resolved", back.since))
        for over in verdicts.stop:
            self.stop(
                over,
                f"used {format_size(over.used_bytes)} of GPU {over.gpu_index}'s memory, over its slice of "
                f"{format_size(over.slice_bytes)}, for more than {grace:g}s (node policy: stop)",
            )

    async def owner(self, over: Overuse) -> tuple[str | None, str | None]:
        """(tenant, user) of the job an alert is about: who may see it. The tenant is the attempt's; the user
        is read from the store (an alert is rare), None when it cannot be."""
        record = self.attempts.get(AttemptKey(over.job_id, over.attempt))
        tenant = record.launch.tenant if record is not None and record.launch is not None else None
        user = None
        try:
            view = await self.service.ledger.load(over.job_id)
        except Exception as exc:  # the store away: the alert still goes, without its user
            log.warning("job %s: its user is not known for the alert: %s", over.job_id, exc)
            view = None
        if view is not None:
            tenant, user = tenant or view.tenant, view.user
        return tenant, user

    async def publish(self, data: EventData, event_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.service.bus.publish(make_event(data, source=self.service.source, id=event_id))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gpu_memory_interval)
            try:
                await self.check()
            except Exception as exc:  # NVML hiccups must not stop the executor
                log.warning("reading GPU memory of jobs failed: %s", exc)

    def forget(self, key: AttemptKey) -> None:
        self.watch.forget(*key)

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close:
            close()
