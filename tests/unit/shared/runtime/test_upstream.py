"""The forwarding hops' HTTP/1.1 client (shared/runtime/upstream.py) against a server on loopback that answers
what each test scripts, byte for byte: keep-alive reuse, bodies streamed both ways (with a length, chunked, to
the connection's close), HEAD, an interim 100 Continue, an idle connection the server closed, and the errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gpuyard.shared.runtime.upstream import Upstream, UpstreamClosed

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A server on loopback whose every connection runs `handler`; `connections` counts them."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    def url(self, path: str = "/") -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{path}"


async def request_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines[1:] if line)
    return lines[0], {k.lower(): v for k, v in headers.items()}


async def body_of(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    if b"content-length" in headers:
        return await reader.readexactly(int(headers[b"content-length"]))
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return body
    return b""


def answer(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%b\r\n%b" % (len(body), b"".join(extra), body)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request with its request line and body, on one keep-alive connection."""
    while True:
        line, headers = await request_head(reader)
        body = await body_of(reader, headers)
        writer.write(answer(line + b" " + body, b"X-Seen: %b\r\n" % headers.get(b"x-mark", b"-")))
        await writer.drain()


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


HOST = [(b"Host", b"test")]


async def test_requests_go_on_one_kept_connection_with_their_bodies_by_length_or_chunked():
    async with Server(echo) as server:
        upstream = Upstream()
        first = await upstream.send("GET", server.url("/a?x=1"), [*HOST, (b"X-Mark", b"one")])
        assert (first.status, await first.read()) == (200, b"GET /a?x=1 HTTP/1.1 ")
        assert (b"X-Seen", b"one") in first.headers
        await first.close()
        sized = await upstream.send(
            "PUT", server.url("/b"), [*HOST, (b"Content-Length", b"6")], pieces(b"abc", b"def")
        )
        assert await sized.read() == b"PUT /b HTTP/1.1 abcdef"
        await sized.close()
        chunked = await upstream.send(
            "POST", server.url("/c"), HOST, pieces(b"x" * 70_000, b"", b"yz"), chunked=True
        )
        assert await chunked.read() == b"POST /c HTTP/1.1 " + b"x" * 70_000 + b"yz"
        await chunked.close()
        assert server.connections == 1
        await upstream.close()


async def test_a_long_answer_streams_chunked_or_to_the_connections_close():
    async def long_answers(reader, writer):
        await request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(50):
            writer.write(b"1000\r\n" + b"a" * 4096 + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"b" * 100_000)
        await writer.drain()

    async with Server(long_answers) as server:
        upstream = Upstream()
        chunked = await upstream.send("GET", server.url(), HOST)
        assert await chunked.read() == b"a" * 4096 * 50
        await chunked.close()
        to_close = await upstream.send("GET", server.url(), HOST)
        assert await to_close.read() == b"b" * 100_000
        await to_close.close()
        assert (
            server.connections == 1 and not upstream.idle[("127.0.0.1", int(server.url().split(":")[2][:-1]))]
        )


async def test_head_has_no_body_and_an_interim_100_continue_is_passed_over():
    async def head_then_continue(reader, writer):
        while True:
            line, headers = await request_head(reader)
            if line.startswith(b"HEAD"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                writer.write(answer(await body_of(reader, headers)))
            await writer.drain()

    async with Server(head_then_continue) as server:
        upstream = Upstream()
        head = await upstream.send("HEAD", server.url(), HOST)
        assert (head.status, await head.read()) == (200, b"")
        await head.close()
        sent = [*HOST, (b"Content-Length", b"2"), (b"Expect", b"100-continue")]
        posted = await upstream.send("POST", server.url(), sent, pieces(b"ok"))
        assert (posted.status, await posted.read()) == (200, b"ok")
        await posted.close()
        assert server.connections == 2  # (a connection that answered HEAD is not used again)


async def test_an_idle_connection_the_server_closed_is_replaced_for_a_request_without_a_body():
    async def one_answer_then_close(reader, writer):
        await request_head(reader)
        writer.write(answer(b"once"))
        await writer.drain()
        await asyncio.sleep(0)  # (then the connection closes, as a server's idle timeout would)

    async with Server(one_answer_then_close) as server:
        upstream = Upstream()
        for _ in range(3):
            got = await upstream.send("GET", server.url(), HOST)
            assert await got.read() == b"once"
            await got.close()
        assert server.connections == 3


async def test_a_refused_connection_and_an_answer_broken_off_raise():
    async def broken(reader, writer):
        await request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async with Server(broken) as server:
        upstream = Upstream()
        got = await upstream.send("GET", server.url(), HOST)
        with pytest.raises(UpstreamClosed):
            await got.read()
        await got.close()
        url = server.url()
    with pytest.raises(OSError):
        await Upstream().send("GET", url, HOST)
