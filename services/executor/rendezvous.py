"""Where an attempt's replicas meet (MASTER_ADDR, MASTER_PORT of torch.distributed): on one node (or in one
Kubernetes cluster, through the attempt's Service), loopback and a free port; across nodes, replica 0's node's
address and a port every node derives alike from the job and attempt."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

from gpuyard.shared.contracts.events.envelope import derived_id
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement

FIRST_PORT = 29500
PORTS = 2000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def master_endpoint(
    job_id: str,
    attempt: int,
    placements: list[ReplicaPlacement],
    *,
    local: bool,
    address_of: Callable[[str], Awaitable[str]],
) -> tuple[str, int]:
    """(address, port); `local`: every replica is reached from here (one node, or the Kubernetes backend)."""
    if local:
        return "127.0.0.1", free_port()
    master = next(p for p in placements if p.replica == 0)
    port = FIRST_PORT + int(derived_id(job_id, attempt, "port")[:8], 16) % PORTS
    return await address_of(master.node), port
