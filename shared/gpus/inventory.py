"""GPU discovery through NVML (`gpuyard.shared.gpus.nvml`, the one module that reads the GPUs), with a virtual inventory
for machines without NVIDIA GPUs.

Used by the executor (to announce its node) and the monitor (to sample). A machine with no NVIDIA driver
reports no GPUs (said once, by `gpuyard.shared.gpus.nvml`); it never fails.
"""

from __future__ import annotations

import contextlib
import os

from gpuyard.shared.contracts.events.nodes import GpuInfo
from gpuyard.shared.gpus.nvml import Nvml, short_model

__all__ = ["host_cpus", "host_memory", "node_gpus", "nvml_gpus", "short_model", "simulated_gpus"]


def nvml_gpus(nvml: Nvml | None = None) -> list[GpuInfo]:
    """The node's NVIDIA GPUs, or [] when NVML (the driver) is absent: read through `gpuyard.shared.gpus.nvml`, the
    process's one NVML (`nvml` for tests)."""
    return (nvml or Nvml.shared()).devices()


def simulated_gpus(node: str, count: int, model: str, memory_bytes: int) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, uuid=f"SIM-{node}-{i}", model=model, memory_bytes=memory_bytes) for i in range(count)
    ]


def node_gpus(node: str, simulate: int, model: str, memory_bytes: int) -> tuple[list[GpuInfo], bool]:
    """(GPUs, simulated?). Real GPUs win; `simulate` > 0 gives a virtual inventory when there are none."""
    real = nvml_gpus()
    if real or simulate <= 0:
        return real, False
    return simulated_gpus(node, simulate, model, memory_bytes), True


def host_cpus() -> float:
    return float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def host_memory() -> int:
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 0
