"""A GPU's reading as a node samples it, for the tests of what the monitor keeps of them."""

from __future__ import annotations

from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading


def reading(index: int, util: float | None, *holders: GpuHolder, mem: int = 1000) -> GpuReading:
    """GPU `index` (of 4000 bytes) at `util` % with `mem` bytes used, held by `holders`."""
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        utilization_pct=util,
        memory_used_bytes=mem,
        memory_total_bytes=4000,
        holders=list(holders),
    )
