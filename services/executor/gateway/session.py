"""One exec session at the gateway: the protocol of `gpuyard.shared.contracts.api.access` over a WebSocket,
driving a command run in a replica (`ExecProcess`). It ends when the command ends (`{"exit": code}` once its
output is sent), when the caller leaves (the command is killed), or when the replica ends (the command is killed:
an exec never outlives its job)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gpuyard.services.executor.gateway.process import ExecProcess
from gpuyard.services.executor.gateway.replicas import NoReplica
from gpuyard.shared.contracts.api.access import (
    STDIN,
    ExecStart,
    ProtocolError,
    data_frame,
    error_frame,
    exit_frame,
    parse_control,
    parse_start,
)

log = logging.getLogger(__name__)

Opener = Callable[[ExecStart], Awaitable[ExecProcess]]
REPLICA_CHECK_SECONDS = 0.5
DRAIN_SECONDS = 2.0
"""After the command ended, how long what it left holding its output may still write (then it is killed)."""
REPLICA_ENDED = "the replica has ended: the exec session ends with it"
PROTOCOL_ERROR = 1008


async def refuse(ws: WebSocket, message: str) -> None:
    with contextlib.suppress(Exception):
        await ws.send_text(error_frame(message))
        await ws.close(PROTOCOL_ERROR)


async def run_session(ws: WebSocket, open_process: Opener, *, tty: bool) -> None:
    """The session on an accepted WebSocket."""
    try:
        start = parse_start(await ws.receive_text(), tty=tty)
    except ProtocolError as exc:
        return await refuse(ws, str(exc))
    except (WebSocketDisconnect, KeyError, RuntimeError):
        return None
    try:
        proc = await open_process(start)
    except NoReplica as exc:
        return await refuse(ws, exc.message)
    except Exception as exc:
        log.warning("an exec session could not start", exc_info=True)
        return await refuse(ws, f"the command could not start: {type(exc).__name__}: {exc}")
    try:
        code = await drive(ws, proc)
    finally:
        await proc.kill()
    if code is not None and ws.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await ws.send_text(exit_frame(code))
            await ws.close()
    return None


async def drive(ws: WebSocket, proc: ExecProcess) -> int | None:
    """Pump until the command ends (its exit code), or the caller leaves or the replica ends (None)."""

    async def send(stream: int, data: bytes) -> None:
        await ws.send_bytes(data_frame(stream, data))

    output = asyncio.create_task(proc.pump_output(send))
    ended = asyncio.create_task(proc.wait())
    caller = asyncio.create_task(read_input(ws, proc))
    replica = asyncio.create_task(watch_replica(proc))
    try:
        done, _ = await asyncio.wait({ended, caller, replica}, return_when=asyncio.FIRST_COMPLETED)
        if ended not in done:
            if replica in done:
                await refuse(ws, REPLICA_ENDED)
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(output), DRAIN_SECONDS)
        return ended.result()
    finally:
        for task in (output, ended, caller, replica):
            task.cancel()
        await asyncio.gather(output, ended, caller, replica, return_exceptions=True)


async def read_input(ws: WebSocket, proc: ExecProcess) -> None:
    """The caller's frames, until it leaves: its input, resizes, the end of its input."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        if (data := message.get("bytes")) is not None:
            if data[:1] == bytes((STDIN,)):
                await proc.write(data[1:])
            continue
        try:
            control = parse_control(message.get("text") or "")
        except ProtocolError as exc:
            await refuse(ws, str(exc))
            return
        if control.resize is not None:
            proc.resize(*control.resize)
        if control.eof:
            await proc.close_stdin()


async def watch_replica(proc: ExecProcess) -> None:
    """Returns once the replica has ended (a look every `REPLICA_CHECK_SECONDS`: a replica's end is no event
    here)."""
    alive = proc.replica_alive
    while alive():  # noqa: ASYNC110 (polled: see above)
        await asyncio.sleep(REPLICA_CHECK_SECONDS)
