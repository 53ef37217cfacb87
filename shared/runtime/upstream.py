"""The forwarding hops' HTTP/1.1 client (`forwarding.forward_http`: the submit service's job proxy towards a node's
executor gateway, and the gateway towards a replica's port): keep-alive connections on asyncio streams, each
answer parsed by httptools (llhttp, the parser uvicorn serves with), its body streamed as it comes.

It does what a proxy's hop needs and no more: one request at a time per connection, the request's body streamed
as it is read (with its length, or chunked), no redirect followed, no proxy of the environment's, no timeout but
the connection's (a notebook's long poll may wait). A connection goes back to the pool only when its answer was
read to its end and both sides keep it alive; an idle one the other side has closed is not used again, and a
request without a body that meets such a connection on its way is sent once more on a new one. A general
client (httpx, httpcore) spends most of a hop's CPU on what it offers beyond that: here a request costs a few
tens of microseconds of the hop's own."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

READ_BYTES = 64 * 1024
NO_BODY_METHODS = frozenset({b"HEAD"})
INFORMATIONAL = range(100, 200)
SWITCHING_PROTOCOLS = 101


class UpstreamClosed(ConnectionError):
    """The other side closed the connection before its answer was whole."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def usable(self, now: float, keepalive_seconds: float) -> bool:
        """Whether an idle connection may carry another request: open on both sides, not idle too long."""
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and now - self.idle_since < keepalive_seconds
        )

    def close(self) -> None:
        self.writer.close()


@dataclass
class _Reading:
    """What httptools has parsed of one answer so far (its callbacks)."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    headers_done: bool = False
    complete: bool = False
    keep_alive: bool = False
    """Whether the connection may carry another request (read when the answer completes: llhttp forgets it)."""
    chunks: deque[bytes] = field(default_factory=deque)
    status: int = 0
    parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.headers_done = self.status not in INFORMATIONAL or self.status == SWITCHING_PROTOCOLS

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.headers_done:
            assert self.parser is not None
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
        else:  # (an interim answer, 100 Continue: the final one follows on the same connection)
            self.headers.clear()


class Answer:
    """The other side's answer: its status and headers, then its body (`stream` or `read`), then `close`, which
    gives the connection back to the pool when the answer was read to its end."""

    def __init__(
        self, pool: Upstream, key: tuple[str, int], conn: _Connection, reading: _Reading, head: bool
    ):
        self.status = reading.status
        self.headers = reading.headers
        self._pool, self._key, self._conn, self._reading = pool, key, conn, reading
        self._head = head
        if head:  # (an answer to HEAD has no body, whatever its Content-Length says)
            reading.complete = True
            reading.chunks.clear()

    async def stream(self) -> AsyncIterator[bytes]:
        reading, conn = self._reading, self._conn
        parser = reading.parser
        assert parser is not None
        while True:
            while reading.chunks:
                yield reading.chunks.popleft()
            if reading.complete:
                return
            data = await conn.reader.read(READ_BYTES)
            if not data:
                if reads_to_close(
                    self.headers
                ):  # (no length, not chunked: the body ends with the connection)
                    reading.complete = True
                    self._head = True  # (not to be used again)
                    return
                raise UpstreamClosed("the connection closed before the answer's end")
            parser.feed_data(data)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])

    async def close(self) -> None:
        reading, conn = self._reading, self._conn
        if reading.complete and reading.keep_alive and not self._head and not reading.chunks:
            self._pool.release(self._key, conn)
        else:
            conn.close()


def reads_to_close(headers: list[tuple[bytes, bytes]]) -> bool:
    names = {name.lower() for name, _ in headers}
    return b"content-length" not in names and b"transfer-encoding" not in names


class Upstream:
    """Keep-alive connections to the next hops, by host and port: at most `max_idle` idle ones each, none idle
    longer than `keepalive_seconds`; a new connection waits at most `connect_seconds`."""

    def __init__(self, connect_seconds: float = 5.0, max_idle: int = 100, keepalive_seconds: float = 30.0):
        self.connect_seconds = connect_seconds
        self.max_idle = max_idle
        self.keepalive_seconds = keepalive_seconds
        self.idle: dict[tuple[str, int], deque[_Connection]] = {}

    async def close(self) -> None:
        for connections in self.idle.values():
            for conn in connections:
                conn.close()
        self.idle.clear()

    def release(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self.idle.setdefault(key, deque())
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _reused(self, key: tuple[str, int]) -> _Connection | None:
        idle, now = self.idle.get(key), time.monotonic()
        while idle:
            conn = (
                idle.pop()
            )  # (the most recently used: the least likely to have been closed by the other side)
            if conn.usable(now, self.keepalive_seconds):
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(*key, limit=READ_BYTES), self.connect_seconds
        )
        return _Connection(reader, writer)

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: AsyncIterator[bytes] | None = None,
        *,
        chunked: bool = False,
    ) -> Answer:
        """`method` `url` (http://host:port/path?query) with `headers` (Host included) and `body` (sent as it
        comes: chunked, with its header, when `chunked`; else as is, its length in `headers`); its answer once its
        headers are in.
        OSError (a refused or lost connection, UpstreamClosed), TimeoutError (the connection not made in time) or
        httptools.HttpParserError (an answer that is not HTTP) otherwise."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = b"".join(
            [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
            + [name + b": " + value + b"\r\n" for name, value in headers]
            + [b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"\r\n"]
        )
        conn = self._reused(key)
        if (
            conn is not None and body is None
        ):  # (an idle connection may turn out closed: once more on a new one)
            try:
                return await self._exchange(key, conn, method, head, None, chunked)
            except OSError:
                conn.close()
            except BaseException:
                conn.close()
                raise
            conn = None
        if conn is None:
            conn = await self._connect(key)
        try:
            return await self._exchange(key, conn, method, head, body, chunked)
        except BaseException:
            conn.close()
            raise

    async def _exchange(
        self,
        key: tuple[str, int],
        conn: _Connection,
        method: str,
        head: bytes,
        body: AsyncIterator[bytes] | None,
        chunked: bool,
    ) -> Answer:
        conn.writer.write(head)
        if body is not None:
            async for chunk in body:
                if chunk:
                    conn.writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.writer.drain()
            if chunked:
                conn.writer.write(b"0\r\n\r\n")
        await conn.writer.drain()
        reading = _Reading()
        reading.parser = parser = httptools.HttpResponseParser(reading)
        while not reading.headers_done:
            data = await conn.reader.read(READ_BYTES)
            if not data:
                raise UpstreamClosed("the connection closed before the answer's headers")
            parser.feed_data(data)
        return Answer(self, key, conn, reading, head=method.encode("latin-1") in NO_BODY_METHODS)
