"""The connection under a request, taken where the API's server lets it be (uvicorn's HTTP/1.1 on httptools, over
plain TCP), so that a large file's bytes are moved by the kernel and never go through Python chunk by chunk,
which was most of a transfer's time and CPU:

- an upload's body of a stated length that nothing has read yet: what the server already read of it is written
  first, then the kernel moves the rest from the socket to the upload's file (`UploadFile.splice_from`). The
  server's parser never sees those bytes, so the connection closes after the answer;
- a file as the answer (`FileAnswer`): its head goes through the server as every answer's, then the kernel
  copies the file to the socket (`sendfile`), and the server is told the body was sent.

Each move runs in a thread of its own (not the loop's pool, which a long transfer would hold). Anything else (TLS,
another server or protocol, a chunked body, a body already begun, a middleware that holds an answer's head back)
takes the ASGI path, as every transfer did before."""

from __future__ import annotations

import asyncio
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gpuyard.shared.runtime.safefolder import chunks_of
from gpuyard.shared.runtime.uploadfile import UploadFile, over_quota

SERVER_CYCLE = ("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle")
"""The server's request cycle whose connection can be taken (its module and class)."""
IDLE_LIMIT = 300.0
"""Seconds a client may take no bytes, or send none, before its transfer is given up."""
POLL_STEP = 1.0
"""Seconds between two looks, while the socket is not ready, at whether the transfer was called off."""
SEND_STEP = 8 << 20
"""Bytes handed to one `sendfile` call."""


class RawConnection:
    """One request's connection (`of` finds it)."""

    def __init__(self, cycle: Any, fd: int):
        self._cycle = cycle
        self._fd = fd

    @classmethod
    def of(cls, receive: Receive) -> RawConnection | None:
        """The connection of the request whose `receive` this is, or None where the ASGI path must be taken."""
        cycle: Any = getattr(receive, "__self__", None)
        if (type(cycle).__module__, type(cycle).__name__) != SERVER_CYCLE:
            return None
        transport = cycle.transport
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None or transport.is_closing():
            return None
        return cls(cycle, sock.fileno())

    # ------------------------------------------------------------------ up

    @classmethod
    def body_of(cls, request: Request) -> tuple[RawConnection, int] | None:
        """(the connection, the body's length) where the body can be taken off it: a stated length, not
        chunked, nothing of it read yet."""
        length = request.headers.get("content-length", "")
        if (
            "transfer-encoding" in request.headers
            or not length.isdigit()
            or getattr(request, "_stream_consumed", False)
        ):
            return None
        raw = cls.of(request.receive)
        return (raw, int(length)) if raw is not None else None

    async def take_body(self, length: int, staging: UploadFile) -> None:
        """The body, `length` bytes, written to `staging`. ClientDisconnect where the client ends, or sends
        nothing for `IDLE_LIMIT` seconds, before the last byte."""
        if staging.room is not None and length > staging.room:
            raise over_quota(staging.room)  # (refused before the socket is taken: the server reads the rest)
        cycle = self._cycle
        cycle.flow.pause_reading()  # (the socket's bytes are this upload's now)
        cycle.keep_alive = False
        if cycle.waiting_for_100_continue:
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        head, cycle.body = bytes(cycle.body), bytearray()
        left = length - len(head)
        stop = threading.Event()

        def move() -> None:
            if head:
                staging.write(head)
            if left > 0:
                staging.splice_from(self._fd, left, lambda: self._ready(select.POLLIN, stop))

        try:
            await _in_own_thread(move, stop)
        except (ConnectionError, TimeoutError):
            raise ClientDisconnect() from None
        finally:
            cycle.more_body = False

    # ---------------------------------------------------------------- down

    async def send_file(self, send: Send, start: dict, fd: int, size: int) -> bool:
        """The answer's head `start` sent through `send`, then the `size` bytes of the open file `fd` copied to
        the socket by the kernel. False where the server has not written the head whole yet (a middleware holds
        it, or the socket was full): the caller then sends the body through `send`."""
        cycle = self._cycle
        await send(start)
        if not cycle.response_started or cycle.transport.get_write_buffer_size():
            return False  # (the head not written whole yet: the body must follow it through the server)
        stop = threading.Event()

        def copy() -> None:
            sent = 0
            while sent < size:
                try:
                    n = os.sendfile(self._fd, fd, sent, min(SEND_STEP, size - sent))
                except BlockingIOError:
                    self._ready(select.POLLOUT, stop)
                    continue
                if n == 0:
                    raise ConnectionResetError(f"the file ended {size - sent} bytes before its length")
                sent += n

        try:
            await _in_own_thread(copy, stop)
        except OSError:  # (the client went away, or the file shrank: the answer cannot be whole)
            cycle.keep_alive = False
            cycle.disconnected = True  # (so the server does not log an answer left unfinished)
            cycle.transport.close()
            return True
        cycle.expected_content_length = 0  # (the server did not count the bytes it did not write)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    def _ready(self, events: int, stop: threading.Event) -> None:
        """Returns once the socket is ready for `events` (or has ended); TimeoutError after `IDLE_LIMIT` seconds
        of waiting, ConnectionAbortedError once the transfer is called off."""
        poll = select.poll()
        poll.register(self._fd, events | select.POLLHUP | select.POLLERR)
        waiting_since = time.monotonic()
        while not poll.poll(POLL_STEP * 1000):
            if stop.is_set():
                raise ConnectionAbortedError("the transfer was called off")
            if time.monotonic() - waiting_since > IDLE_LIMIT:
                raise TimeoutError(f"the connection was not ready for {IDLE_LIMIT:.0f} s")


class FileAnswer(StreamingResponse):
    """A file, opened (`fd`, `size` bytes), as the answer: copied to the socket by the kernel where the
    connection can be taken, streamed in chunks through the server otherwise. The file is closed either way."""

    def __init__(self, fd: int, size: int, headers: dict[str, str], media_type: str):
        super().__init__(
            chunks_of(fd), media_type=media_type, headers={**headers, "Content-Length": str(size)}
        )
        self._fd = fd
        self._size = size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = RawConnection.of(receive) if scope["method"] == "GET" else None
        if raw is None:
            return await super().__call__(scope, receive, send)
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        try:
            sent = await raw.send_file(send, start, self._fd, self._size)
        except BaseException:
            os.close(self._fd)
            raise
        if sent:
            os.close(self._fd)
            return None
        async for chunk in self.body_iterator:  # (closes the file at its end)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None


async def _in_own_thread(work: Callable[[], None], stop: threading.Event) -> None:
    """`work` run in a thread of its own, awaited. Called off (the request cancelled), it is told to stop and
    awaited still: nothing of it runs on afterwards, when its file is closed or removed."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        try:
            work()
        except BaseException as error:  # (handed to the awaiting task)
            loop.call_soon_threadsafe(settle, error)
        else:
            loop.call_soon_threadsafe(settle, None)

    threading.Thread(target=run, name="transfer", daemon=True).start()
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([done])
        raise
