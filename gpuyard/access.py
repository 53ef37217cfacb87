"""Into a running job from the client: a command run in one of its replicas (`exec_command`, `ExecSession`), and
a local port forwarded to one of its ports (`PortForward`), through the submit API (docs/access.md). What the
CLI's `exec`, `shell` and `port-forward` run on (`gpuyard/cli/access.py`), on the `websockets` package."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from gpuyard.shared.contracts.api.access import (
    STDERR,
    STDIN,
    STDOUT,
    ExecStart,
    data_frame,
)
from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.runtime.streampipe import pipe

NEEDS_WEBSOCKETS = f"this needs the websockets package, which GPUYARD installs: {install_command()}"
MAX_HEAD = 64 * 1024


class AccessError(Exception):
    """Why a job cannot be reached, in one line."""


def websockets_module() -> Any:
    try:
        import websockets
    except ModuleNotFoundError:
        raise AccessError(NEEDS_WEBSOCKETS) from None
    return websockets


def exec_url(server: str, job_id: str, *, replica: int, tty: bool) -> str:
    base = "ws" + server.rstrip("/").removeprefix("http")
    return f"{base}/v1/jobs/{quote(job_id, safe='')}/exec?replica={replica}&tty={int(tty)}"


def refusal_words(status: int, body: bytes) -> str:
    try:
        detail = json.loads(body or b"{}")["detail"]
    except (ValueError, KeyError, TypeError):
        detail = body.decode(errors="replace").strip()[:200] or "refused"
    return f"{detail} ({status})"


class ExecSession:
    """One exec session: `output()` yields (stream, data) until the command ends; `exit_code` is then its code."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.exit_code: int | None = None

    @classmethod
    async def open(
        cls,
        server: str,
        token: str | None,
        job_id: str,
        start: ExecStart,
        *,
        replica: int = 0,
        tty: bool = False,
    ) -> ExecSession:
        ws = websockets_module()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            conn = await ws.connect(
                exec_url(server, job_id, replica=replica, tty=tty),
                additional_headers=headers,
                max_size=None,
                compression=None,
                proxy=None,
                open_timeout=30,
            )
        except ws.exceptions.InvalidStatus as exc:
            raise AccessError(refusal_words(exc.response.status_code, exc.response.body or b"")) from None
        except (OSError, ws.exceptions.InvalidHandshake, TimeoutError) as exc:
            raise AccessError(f"cannot reach GPUYARD at {server}: {exc or type(exc).__name__}") from None
        await conn.send(start.to_json())
        return cls(conn)

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        ws = websockets_module()
        try:
            async for message in self.conn:
                if isinstance(message, bytes):
                    if message[:1] in (bytes((STDOUT,)), bytes((STDERR,))):
                        yield message[0], message[1:]
                    continue
                doc = json.loads(message)
                if "exit" in doc:
                    self.exit_code = int(doc["exit"])
                elif "error" in doc:
                    raise AccessError(str(doc["error"]))
        except ws.exceptions.ConnectionClosedError as exc:
            raise AccessError(f"the session was cut: {exc}") from None
        if self.exit_code is None:
            raise AccessError("the session ended without the command's exit code")

    async def send_input(self, data: bytes) -> None:
        with contextlib.suppress(Exception):
            await self.conn.send(data_frame(STDIN, data))

    async def eof(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.send(json.dumps({"eof": True}))

    async def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(Exception):
            await self.conn.send(json.dumps({"resize": [cols, rows]}))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()


async def exec_command(
    server: str,
    token: str | None,
    job_id: str,
    argv: list[str],
    *,
    replica: int = 0,
    on_output: Callable[[int, bytes], None] | None = None,
) -> int:
    """Run `argv` in the job's replica; its output to `on_output` (stream, data) as it comes; its exit code."""
    session = await ExecSession.open(server, token, job_id, ExecStart(argv=argv), replica=replica)
    try:
        async for stream, data in session.output():
            if on_output is not None:
                on_output(stream, data)
    finally:
        await session.close()
    assert session.exit_code is not None
    return session.exit_code


# ---------------------------------------------------------------- port-forward


def rewrite_head(head: bytes, prefix: str, host: str, token: str | None) -> bytes:
    """A request's head for the API: its target under `prefix`, the API's Host, the token, one request per
    connection (a WebSocket's upgrade kept)."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    if not target.startswith("/"):
        raise ValueError("a request target is a path")
    kept, upgrade = [], False
    for line in lines[1:]:
        name = line.split(":", 1)[0].strip().lower()
        if not line or name in ("host", "connection", "authorization", "proxy-connection", "keep-alive"):
            continue
        upgrade = upgrade or name == "upgrade"
        kept.append(line)
    kept += [f"Host: {host}", "Connection: " + ("Upgrade" if upgrade else "close")]
    if token:
        kept.append(f"Authorization: Bearer {token}")
    return ("\r\n".join([f"{method} {prefix}{target} {version}", *kept]) + "\r\n\r\n").encode("latin-1")


class PortForward:
    """A local listener whose every connection carries one HTTP request (or a WebSocket) to the job's port,
    `/jobs/{id}/ports/{port}/…` on the API, with the token."""

    def __init__(self, server: str, token: str | None, job_id: str, port: int, *, replica: int = 0):
        parts = urlsplit(server)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc
        self.token = token
        where = f"/jobs/{quote(job_id, safe='')}"
        self.prefix = f"{where}/ports/{port}" if replica == 0 else f"{where}/replicas/{replica}/ports/{port}"
        self.server: asyncio.Server | None = None

    async def start(self, local_host: str, local_port: int) -> int:
        """Listen; the local port (a free one for 0)."""
        self.server = await asyncio.start_server(self.handle, local_host, local_port)
        return self.server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_HEAD:
                raise ValueError("request head too long")
            request = rewrite_head(head[:-4], self.prefix, self.host_header, self.token)
            context = ssl.create_default_context() if self.tls else None
            up_reader, up_writer = await asyncio.open_connection(
                self.host, self.port, ssl=context, server_hostname=self.host if self.tls else None
            )
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            with contextlib.suppress(Exception):
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
            writer.close()
            return
        up_writer.write(request)
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            for side in (up_writer, writer):
                with contextlib.suppress(Exception):
                    side.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
