"""What the scheduler believes of a node's heartbeat: an inventory no machine has (a negative, infinite or
absurd number, two GPUs with one index) is refused with the reason, so that a broken or forged announcement
never draws jobs onto GPUs that are not there. The bus users (docs/operations.md) keep anyone but an
executor from announcing a node at all; this keeps one executor's nonsense out of the scheduler's sums.

A heartbeat comes twice (live and from the stream: `main.follow_heartbeats`) and is a newer-wins fact: each
node's newest, by the time it was sent, is taken once (`HeartbeatIntake`), and a copy or an older one changes
nothing."""

from __future__ import annotations

import logging
import math

from gpuyard.services.scheduler.view import ClusterView
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat

log = logging.getLogger(__name__)

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
MAX_REFUSED_NODES = 1000
"""Nodes whose refused heartbeat is remembered (to say it once)."""


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


class HeartbeatIntake:
    """The heartbeats the scheduler takes into its view: each node's newest once, none that no machine could
    send (said once per node and problem, not every 5 s)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.heard: dict[str, tuple[float, str]] = {}
        """Node → its newest heartbeat taken: when it was sent (no later than when it came) and its id. The
        other copy of it, or an older one, is not taken."""
        self.refused_nodes: dict[str, str] = {}  # node -> why its last heartbeat was ignored

    def take(self, hb: NodeHeartbeat, event_id: str, sent: float) -> bool:
        """Take `hb` (event `event_id`, sent at `sent`) unless it is not newer than the node's newest taken or
        describes no real node. True when the node is new or its inventory changed (a cycle may place there)."""
        newest = self.heard.get(hb.node)
        if newest is not None and (event_id == newest[1] or sent < newest[0]):
            return False
        problem = heartbeat_problem(hb)
        if problem is not None:
            self.refuse(hb.node, problem)
            return False
        self.refused_nodes.pop(hb.node, None)
        self.heard[hb.node] = (sent, event_id)
        if not self.view.observe_node(hb, now=sent):
            return False
        log.info("node %s: %d GPU(s)", hb.node, len(hb.gpus))
        return True

    def refuse(self, node: str, problem: str) -> None:
        if self.refused_nodes.get(node) != problem:  # said once, not every 5 s
            log.warning("node %s: heartbeat ignored: %s", node[:80], problem)
        if len(self.refused_nodes) >= MAX_REFUSED_NODES:
            self.refused_nodes.clear()
        self.refused_nodes[node] = problem
