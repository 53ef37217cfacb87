"""One node's GPUs read at one moment, as the `GpuReading`s of its `gpu.sample`: from NVML (`gpuyard.shared.gpus.nvml`) with
the holders of each GPU added, or from the simulated GPUs (`simulated.py`), which read their holders' CPU use.

A sample is bounded: one node's GPUs, each with at most `MAX_LISTED` processes and holders.
"""

from __future__ import annotations

import logging

from gpuyard.services.monitor.cputime import CpuUse
from gpuyard.services.monitor.jobs import HeldGpu
from gpuyard.services.monitor.simulated import ReplicaPids, SimulatedGpus
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading
from gpuyard.shared.gpus.inventory import simulated_gpus
from gpuyard.shared.gpus.nvml import Nvml
from gpuyard.shared.settings.monitor import MonitorSettings

log = logging.getLogger(__name__)

MAX_LISTED = 64
"""Most processes and holders listed per GPU in a sample."""


class NodeSampler:
    """Reads the node's GPUs (`read`, blocking: run it in a thread)."""

    def __init__(self, *, nvml: Nvml | None = None, simulated: SimulatedGpus | None = None):
        if (nvml is None) == (simulated is None):
            raise ValueError("a sampler reads NVML or simulated GPUs, one of the two")
        self.nvml = nvml
        self.simulated = simulated

    @property
    def is_simulated(self) -> bool:
        return self.simulated is not None

    @property
    def count(self) -> int:
        return len(self.simulated.gpus) if self.simulated is not None else self._nvml.count

    @property
    def _nvml(self) -> Nvml:
        assert self.nvml is not None  # (one of the two: `__init__` checks)
        return self.nvml

    def read(self, held: list[HeldGpu]) -> list[GpuReading]:
        if self.simulated is not None:
            return [bounded(r) for r in self.simulated.read(held)]
        by_gpu: dict[int, list[GpuHolder]] = {}
        for h in held:
            by_gpu.setdefault(h.gpu_index, []).append(h.holder)
        return [bounded(r.model_copy(update={"holders": by_gpu.get(r.index, [])})) for r in self._nvml.read()]


def bounded(reading: GpuReading) -> GpuReading:
    if len(reading.processes) <= MAX_LISTED and len(reading.holders) <= MAX_LISTED:
        return reading
    return reading.model_copy(
        update={"processes": reading.processes[:MAX_LISTED], "holders": reading.holders[:MAX_LISTED]}
    )


def choose_sampler(settings: MonitorSettings, nvml: Nvml | None = None) -> NodeSampler | None:
    """NVML's GPUs when there are any; else the simulated ones when asked for; else None (zero GPUs: NVML
    already said why, once)."""
    nvml = nvml or Nvml.shared()
    if nvml.count:
        return NodeSampler(nvml=nvml)
    if settings.simulate_gpus > 0:
        gpus = simulated_gpus(
            settings.node_name,
            settings.simulate_gpus,
            settings.simulated_gpu_model,
            settings.simulated_gpu_memory,
        )
        log.info(
            "node %s: %d simulated GPU(s): their utilization is the CPU use of the jobs placed on them",
            settings.node_name,
            len(gpus),
        )
        return NodeSampler(
            simulated=SimulatedGpus(gpus, ReplicaPids(settings.data_dir, settings.node_name), CpuUse())
        )
    return None
