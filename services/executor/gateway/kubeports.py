"""A replica's port on the Kubernetes backend, through the port-forward API: a listener of the executor's own on
loopback per pod and port, each of whose connections is one port-forward stream to the pod (as `kubectl
port-forward` opens one per connection); the gateway forwards HTTP and WebSocket requests to it like to a local
replica's port. A listener unused for `IDLE_SECONDS` is closed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpuyard.services.executor.kubernetes.api import KubeApi, KubeApiError
from gpuyard.shared.runtime.streampipe import pipe

log = logging.getLogger(__name__)
IDLE_SECONDS = 600.0


class Tunnels:
    def __init__(self, api: KubeApi, namespace: str):
        self.api = api
        self.namespace = namespace
        self.open: dict[tuple[str, int], tuple[asyncio.Server, int]] = {}
        self.used: dict[tuple[str, int], float] = {}

    async def url(self, pod: str, port: int) -> str:
        """`http://127.0.0.1:<local port>` of the tunnel to the pod's `port` (made at its first use)."""
        key, now = (pod, port), time.monotonic()
        self.used[key] = now
        await self.close_idle(now)
        if key not in self.open:
            server = await asyncio.start_server(lambda r, w: self.carry(pod, port, r, w), "127.0.0.1", 0)
            self.open[key] = (server, server.sockets[0].getsockname()[1])
        return f"http://127.0.0.1:{self.open[key][1]}"

    async def carry(
        self, pod: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            sock = await self.api.port_forward(self.namespace, pod, port)
            far_reader, far_writer = await asyncio.open_connection(sock=sock)
        except (KubeApiError, OSError) as exc:
            log.warning("port-forward to pod %s port %d refused: %s", pod, port, exc)
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, far_writer), pipe(far_reader, writer))
        finally:
            for side in (far_writer, writer):
                with contextlib.suppress(Exception):
                    side.close()

    async def close_idle(self, now: float) -> None:
        for key in [k for k, used in self.used.items() if now - used > IDLE_SECONDS]:
            self.used.pop(key, None)
            server, _ = self.open.pop(key, (None, 0))
            if server is not None:
                server.close()
