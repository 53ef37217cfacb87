"""The gateway's server: uvicorn in the executor's own event loop, on `gateway_host` and `gateway_port` (0: a
free port), its URL announced in the node's heartbeat (`NodeHeartbeat.gateway`)."""

from __future__ import annotations

import contextlib
import logging
import socket

import uvicorn

from gpuyard.services.executor.gateway.access import ReplicaAccess
from gpuyard.services.executor.gateway.app import gateway_app
from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.settings.gateway import GatewaySettings

log = logging.getLogger(__name__)
ANY_ADDRESS = ("0.0.0.0", "::", "")


def bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def gateway_url(settings: GatewaySettings, port: int, address: str) -> str:
    """The URL the heartbeat announces: `gateway_url`, else the host and bound port (the node's `address` for
    a host that is every address)."""
    if settings.gateway_url:
        return settings.gateway_url.rstrip("/")
    host = address if settings.gateway_host in ANY_ADDRESS else settings.gateway_host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Gateway:
    def __init__(self, settings: GatewaySettings, access: ReplicaAccess, *, address: str):
        self.settings = settings
        self.socket = bound_socket(settings.gateway_host, settings.gateway_port)
        self.url = gateway_url(settings, self.socket.getsockname()[1], address)
        app = gateway_app(GatewayToken(settings.gateway_token_path), access)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", ws_max_size=16 << 20
        )
        self.server = uvicorn.Server(config)
        # the service runtime owns SIGTERM and SIGINT: uvicorn takes none of them
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]

    async def serve(self) -> None:
        log.info("executor gateway at %s", self.url)
        await self.server.serve(sockets=[self.socket])

    def stop(self) -> None:
        self.server.should_exit = True
