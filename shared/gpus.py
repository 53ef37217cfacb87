"""GPU discovery through NVML (nvidia-ml-py), with a virtual inventory for machines without NVIDIA GPUs.

Used by the executor (to announce its node) and the monitor (to sample). A machine with no NVIDIA driver
reports no GPUs; it never fails.
"""

from __future__ import annotations

import contextlib
import logging
import os

from shared.events import GpuInfo

log = logging.getLogger(__name__)


def nvml_gpus() -> list[GpuInfo]:
    """The node's NVIDIA GPUs, or [] when NVML (the driver) is absent."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.debug("no NVIDIA GPU found (NVML: %s)", exc)  # (the services say what it means to them)
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                    model=short_model(name.decode() if isinstance(name, bytes) else name),
                    memory_bytes=int(mem.total),
                )
            )
        return gpus
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def short_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; the model names users write in gpu_model constraints."""
    for token in name.replace("NVIDIA", "").replace("Tesla", "").split():
        if any(c.isdigit() for c in token) and token[0].isalpha():
            return token.upper()
    return name.strip()


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
