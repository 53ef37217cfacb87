"""GPU health, judged by each node's monitor from its own node's samples, as NVIDIA's k8s device plugin judges
it: a GPU is unhealthy after an XID error that is not an application error (13, 31, 43, 45, 68, 109: the job's
code failed, the GPU is fine), after new uncorrected ECC errors, or once NVML reports it lost.

`HealthJudge` is the pure part: sample in, the `gpu.health_changed`-style marks (`GpuHealthChanged`) out. It
reacts to what is new: the XIDs of a sample are those since the previous one, an ECC count that grew since
the previous sample (or any count in the first sample this monitor sees: errors since the driver loaded), a
GPU that became lost. A GPU never turns healthy by itself: only an admin's uncordon clears the mark
(docs/monitor.md, "GPU health, cordon and drain").

`HealthMarker` is the wiring: a listener of the monitor's ingest that records each mark in the event store
(`gpuyard.shared.stores.readmodels.nodecontrol`, so that a restarted scheduler knows) and publishes it as `node.gpu_health`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from gpuyard.services.monitor.ingest import NodeSample, SampleIngest
from gpuyard.services.monitor.rules import APPLICATION_XIDS
from gpuyard.shared.bus.outbox import publish_recorded
from gpuyard.shared.contracts.events.envelope import derived_id, make_event
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, GpuReading, GpuSample
from gpuyard.shared.stores.readmodels import nodecontrol

log = logging.getLogger(__name__)

XID = "xid"
ECC = "ecc_uncorrected"
LOST = "lost"


@dataclass(slots=True)
class _Seen:
    ecc_uncorrected: int | None
    lost: bool


class HealthJudge:
    """What is new and fatal in each sample of one node."""

    def __init__(self, node: str, application_xids: Iterable[int] = APPLICATION_XIDS):
        self.node = node
        self.application_xids = frozenset(application_xids)
        self.seen: dict[str, _Seen] = {}  # GPU uuid (or index) -> what the previous sample said

    def judge(self, sample: GpuSample) -> list[GpuHealthChanged]:
        if sample.node != self.node:
            return []
        out = []
        for gpu in sample.gpus:
            key = gpu.uuid or str(gpu.index)
            before = self.seen.get(key)
            self.seen[key] = _Seen(gpu.ecc_uncorrected, gpu.lost)
            mark = self._mark(gpu, before)
            if mark is not None:
                out.append(mark)
        return out

    def _mark(self, gpu: GpuReading, before: _Seen | None) -> GpuHealthChanged | None:
        if gpu.lost and (before is None or not before.lost):
            return self._unhealthy(gpu, LOST, "NVML reports the GPU lost (fallen off the bus)")
        fatal = [x for x in gpu.xids if x not in self.application_xids]
        if fatal:
            return self._unhealthy(gpu, XID, f"fatal XID {fatal[-1]}", xid=fatal[-1])
        was = (before.ecc_uncorrected if before is not None else 0) or 0
        if gpu.ecc_uncorrected is not None and gpu.ecc_uncorrected > was:
            return self._unhealthy(
                gpu, ECC, f"{gpu.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded"
            )
        return None

    def _unhealthy(self, gpu: GpuReading, reason: str, message: str, xid: int | None = None):
        return GpuHealthChanged(
            node=self.node,
            index=gpu.index,
            uuid=gpu.uuid,
            healthy=False,
            reason=reason,
            message=message,
            xid=xid,
        )


class HealthMarker:
    """Records and publishes the judge's marks for the monitor of `node`."""

    def __init__(self, service, node: str, application_xids: Iterable[int] = APPLICATION_XIDS):
        self.service = service
        self.judge = HealthJudge(node, application_xids)
        self.marks: asyncio.Queue[tuple[GpuHealthChanged, float]] = asyncio.Queue()
        self.recorded = 0

    def attach(self, ingest: SampleIngest) -> None:
        ingest.subscribe(self.on_sample)

    def on_sample(self, new: NodeSample) -> None:
        for mark in self.judge.judge(new.sample):
            self.marks.put_nowait((mark, new.taken_at))

    async def run(self) -> None:
        while True:
            mark, taken_at = await self.marks.get()
            try:
                await self.record(mark, taken_at)
            except Exception:  # one failed mark never stops the next ones
                log.exception("marking node %s GPU %d unhealthy failed", mark.node, mark.index)

    async def record(self, mark: GpuHealthChanged, taken_at: float) -> None:
        event = make_event(
            mark,
            source=self.service.source,
            id=derived_id("gpu-health", mark.node, mark.index, mark.reason, taken_at),
        )
        log.warning("node %s GPU %d unhealthy: %s", mark.node, mark.index, mark.message)
        store, bus = self.service.store, self.service.bus
        try:
            await nodecontrol.record(store, event)
        except Exception as exc:  # published all the same; the scheduler reads the bus too
            log.error("recording GPU %s/%d unhealthy failed: %s", mark.node, mark.index, exc)
        await publish_recorded(bus, event, store)
        self.recorded += 1
