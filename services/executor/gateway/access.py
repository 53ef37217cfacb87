"""What the gateway asks of the backend's replicas (`ReplicaAccess`): a command run in one, and where a port it
listens on is reached. The local backend's: `LocalAccess`; the Kubernetes backend's: `kubeaccess.py`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from gpuyard.services.executor.gateway.listeners import Listeners
from gpuyard.services.executor.gateway.localexec import start_local
from gpuyard.services.executor.gateway.process import ExecProcess
from gpuyard.services.executor.gateway.replicas import LocalReplicas, NoReplica, ReplicaKey
from gpuyard.shared.contracts.api.access import ExecStart


class ReplicaAccess(Protocol):
    async def open_exec(self, key: ReplicaKey, start: ExecStart, *, tty: bool) -> ExecProcess:
        """The command of `start` started in the replica; NoReplica when it cannot be."""
        ...

    async def port_url(self, key: ReplicaKey, port: int) -> str:
        """The base URL (`http://host:port`) of the replica's `port`; NoReplica when it does not listen there."""
        ...


def not_listening(key: ReplicaKey, port: int) -> NoReplica:
    return NoReplica(404, f"nothing of {key} listens on port {port} (yet?)")


class LocalAccess:
    """The local backend's replicas on this node (their pid files; every executor process of the node's)."""

    def __init__(self, data_dir: Path, node: str):
        self.replicas = LocalReplicas(data_dir, node)
        self.listeners = Listeners()

    async def open_exec(self, key: ReplicaKey, start: ExecStart, *, tty: bool) -> ExecProcess:
        target = await asyncio.to_thread(self.replicas.find, key)
        return await start_local(target, start, tty=tty)

    async def port_url(self, key: ReplicaKey, port: int) -> str:
        host = self.listeners.host(self.replicas.running(key), port)
        if host is None:
            raise not_listening(key, port)
        return f"http://{host}:{port}"
