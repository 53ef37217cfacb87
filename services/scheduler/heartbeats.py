"""What the scheduler believes of a node's heartbeat: an inventory no machine has (a negative, infinite or
absurd number, two GPUs with one index) is refused with the reason, so that a broken or forged announcement
never draws jobs onto GPUs that are not there. The bus users (docs/operations.md) keep anyone but an
executor from announcing a node at all; this keeps one executor's nonsense out of the scheduler's sums."""

from __future__ import annotations

import math

from gpuyard.shared.contracts.events.nodes import NodeHeartbeat

MAX_GPUS = 64
"""GPUs of one node: eight or sixteen in today's largest machines."""
MAX_GPU_INDEX = 1023
MAX_GPU_MEMORY = 4 << 40
"""Bytes of one GPU (today's largest hold under 300 GB)."""
MAX_CPUS = 8192
MAX_MEMORY = 256 << 40
"""Bytes of one node's memory."""
MAX_NAME = 253
"""A node name is a host name: at most 253 characters."""


def heartbeat_problem(hb: NodeHeartbeat) -> str | None:
    """Why `hb` cannot describe a real node, or None when it can."""
    if not hb.node or len(hb.node) > MAX_NAME or any(c.isspace() for c in hb.node):
        return f"node name {hb.node[:40]!r} is not a host name"
    if not (math.isfinite(hb.cpus) and 0 <= hb.cpus <= MAX_CPUS):
        return f"cpus {hb.cpus} outside 0..{MAX_CPUS}"
    if not 0 <= hb.memory_bytes <= MAX_MEMORY:
        return f"memory {hb.memory_bytes} bytes outside 0..{MAX_MEMORY}"
    if not (math.isfinite(hb.interval_seconds) and 0 < hb.interval_seconds <= 3600):
        return f"heartbeat interval {hb.interval_seconds} s outside (0, 3600]"
    if len(hb.gpus) > MAX_GPUS:
        return f"{len(hb.gpus)} GPUs, more than {MAX_GPUS}"
    indexes = [g.index for g in hb.gpus]
    if len(set(indexes)) != len(indexes):
        return f"GPU indexes {sorted(indexes)} repeat"
    for g in hb.gpus:
        if not 0 <= g.index <= MAX_GPU_INDEX:
            return f"GPU index {g.index} outside 0..{MAX_GPU_INDEX}"
        if not 0 <= g.memory_bytes <= MAX_GPU_MEMORY:
            return f"GPU {g.index}: memory {g.memory_bytes} bytes outside 0..{MAX_GPU_MEMORY}"
    return None
