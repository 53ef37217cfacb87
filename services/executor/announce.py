"""Node announcement: this node's heartbeat (the Kubernetes backend: one per GPU node of the cluster) every
`heartbeat_interval`, and the other nodes' addresses learnt from theirs (MASTER_ADDR of a job spread over
several nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from gpuyard.services.executor.backend import Backend
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.gpus.inventory import host_cpus, host_memory
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.executor import ExecutorSettings

log = logging.getLogger(__name__)


def default_address() -> str:
    """This host's address as other nodes would reach it (MASTER_ADDR of distributed jobs): the source
    address of its default route (no packet is sent), else what its hostname resolves to."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class NodeAnnouncer:
    def __init__(
        self,
        service: Service,
        settings: ExecutorSettings,
        backend: Backend,
        *,
        gpus: list[GpuInfo],
        simulated: bool,
    ):
        self.service = service
        self.settings = settings
        self.backend = backend
        self.node = settings.node_name
        self.gpus = gpus
        self.simulated = simulated
        self.address = settings.advertise_address or default_address()
        self.addresses: dict[str, str] = {self.node: self.address}
        """Node → address, from the nodes' heartbeats (one entry per node, not per job)."""
        self.nodes_unavailable = False
        """The backend failed to list its nodes last round (logged once per outage)."""
        self.announced: list[str] = []
        self.gateway = ""
        """The URL of this executor's gateway (exec, shell, ports: `gateway/`), "" when it serves none."""

    def heartbeat(self) -> NodeHeartbeat:
        labels = {"hostname": socket.gethostname(), "address": self.address, "backend": self.backend.name}
        if self.backend.limits:
            labels["limits"] = self.backend.limits
        return NodeHeartbeat(
            node=self.node,
            gpus=self.gpus,
            cpus=host_cpus(),
            memory_bytes=host_memory(),
            simulated=self.simulated,
            labels=labels,
            interval_seconds=self.settings.heartbeat_interval,
            gateway=self.gateway,
        )

    async def announce_once(self) -> list[NodeHeartbeat]:
        """Publish one heartbeat (fresh id) per node the backend reports: this node (local backend) or the
        cluster's GPU nodes (Kubernetes). When the backend cannot list them, nothing is announced this
        round (the scheduler's node timeout decides what that means) and the outage is logged once."""
        try:
            heartbeats = await self.backend.nodes(self.heartbeat())
        except Exception as exc:
            if not self.nodes_unavailable:
                log.warning(
                    "cannot list the nodes to announce (%s: %s); announcing none until it works again",
                    type(exc).__name__,
                    exc,
                )
            self.nodes_unavailable = True
            return []
        if self.nodes_unavailable:
            log.info("listing the nodes to announce works again")
            self.nodes_unavailable = False
        names = sorted(hb.node for hb in heartbeats)
        if self.backend.runs_every_node and names != self.announced:
            gpus = sum(len(hb.gpus) for hb in heartbeats)
            log.info("announcing %d node(s) with %d GPU(s): %s", len(names), gpus, ", ".join(names) or "none")
        self.announced = names
        bus = self.service.bus
        for heartbeat in heartbeats:
            with contextlib.suppress(Exception):
                await bus.publish(make_event(heartbeat, source=self.service.source))
        return heartbeats

    async def run(self) -> None:
        if self.backend.runs_every_node:
            log.info("backend %s: announcing the nodes it runs replicas on", self.backend.name)
        else:
            kind = "simulated" if self.simulated else "NVIDIA"
            log.info("node %s: %d %s GPU(s), backend %s", self.node, len(self.gpus), kind, self.backend.name)
        while True:
            await self.announce_once()
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def on_heartbeat(self, data: NodeHeartbeat, _event: CloudEvent) -> None:
        """Learn the other nodes' addresses (for MASTER_ADDR of jobs spread over several nodes)."""
        if data.labels.get("address"):
            self.addresses[data.node] = data.labels["address"]

    async def address_of(self, node: str) -> str:
        """A node's address from its heartbeats; a just-started executor waits for them a little, then
        falls back to the node's name (right when node names are host names)."""
        for _ in range(int(self.settings.heartbeat_interval * 20) + 20):
            if node in self.addresses:
                break
            await asyncio.sleep(0.1)
        return self.addresses.get(node, node)
