"""A tiny HTTP endpoint for liveness and readiness probes (/healthz, /readyz), with no web framework."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable


class HealthServer:
    def __init__(
        self,
        name: str,
        ready: Callable[[], bool],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        detail: Callable[[], dict[str, object]] | None = None,
    ):
        """`detail`: more for /readyz to say, whatever the answer (the bus's state and last trouble)."""
        self.name, self.ready, self.host, self.port = name, ready, host, port
        self.detail = detail
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            parts = line.decode(errors="replace").split()
            path = parts[1] if len(parts) > 1 else "/"
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            body: dict[str, object]
            if path == "/healthz":
                status, body = 200, {"status": "ok", "service": self.name}
            elif path == "/readyz":
                ok = self.ready()
                status, body = (200 if ok else 503), {"ready": ok, "service": self.name}
                body.update(self.detail() if self.detail is not None else {})
            else:
                status, body = 404, {"detail": "not found"}
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
