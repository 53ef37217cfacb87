"""One file sent or fetched over plain HTTP straight through the socket: up with `sendfile` (the kernel copies the
file to the connection), down with `splice` (the kernel moves the bytes from the connection to the file,
never through the program; where it cannot, `readinto` into one reused buffer). What the CLI's volume and
artifact transfers use where nothing stands between it and the server (an http:// server, no proxy for it):
httpx copies each chunk several times on its way, which for gigabytes is most of a transfer's time. Elsewhere
(https, a proxy) they go through httpx as every other request does (`gpuyard.transfers`).

Each transfer is one request on a connection of its own (`Connection: close`), with the client's headers (its
token); the answer comes back as an `httpx.Response` (its body read, or streamed for a download), so that errors
read as the client's other answers do."""

from __future__ import annotations

import http.client
import os
import socket
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from gpuyard.shared.runtime.splice import SPLICE, splice_exactly

STEP = 8 << 20
"""Bytes handed to one `sendfile` call (the progress moves after each)."""
BUFFER = 1 << 20
"""The buffer a download is read into (where the kernel cannot splice it)."""


def direct(http: httpx.Client) -> bool:
    """Whether transfers of this client may go straight through a socket: a plain http:// server reached over
    the network (httpx's own transport, not one a program put in, such as a test's), that no proxy of the
    environment stands in front of."""
    url = urlsplit(str(http.base_url))
    if (
        url.scheme != "http"
        or not url.hostname
        or type(getattr(http, "_transport", None)) is not httpx.HTTPTransport
    ):
        return False
    return "http" not in urllib.request.getproxies() or bool(urllib.request.proxy_bypass(url.hostname))


def _connect(http: httpx.Client, method: str, path: str, params: dict[str, Any], headers: dict[str, str]):
    """A connection with the request's head sent: (socket, the full URL)."""
    base = urlsplit(str(http.base_url))
    target = f"{base.path.rstrip('/')}{path}" + (f"?{urlencode(params)}" if params else "")
    host = base.hostname or "localhost"
    port = base.port or 80
    sock = socket.create_connection((host, port))
    head = {
        "Host": base.netloc,
        "User-Agent": http.headers.get("user-agent", "gpuyard"),
        "Connection": "close",
        **{k: v for k, v in http.headers.items() if k.lower() == "authorization"},
        **headers,
    }
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    try:
        sock.sendall("\r\n".join(lines).encode("latin-1"))
    except OSError:
        sock.close()
        raise
    return sock, f"{base.scheme}://{base.netloc}{target}"


def _response(sock: socket.socket, method: str, url: str, *, stream: bool) -> httpx.Response:
    """The answer on `sock`: its body read whole, or (`stream`) left to read through `chunks`."""
    answer = http.client.HTTPResponse(sock, method=method)
    answer.begin()
    request = httpx.Request(method, url)
    if stream:
        response = httpx.Response(answer.status, headers=answer.getheaders(), request=request)
        response.extensions["raw"] = answer
        return response
    body = answer.read()
    answer.close()
    return httpx.Response(answer.status, headers=answer.getheaders(), content=body, request=request)


def put_file(
    http: httpx.Client,
    path: str,
    params: dict[str, Any],
    file: Path,
    media: str,
    progress: Callable[[int], None],
) -> httpx.Response:
    """PUT the file `file` as the body of `path`: its answer. An answer the server gives before it has read the
    whole body (a refusal) is the answer; a connection that fails otherwise raises OSError."""
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        sock, url = _connect(http, "PUT", path, params, {"Content-Type": media, "Content-Length": str(size)})
        with sock:
            sent = 0
            try:
                while sent < size:
                    n = os.sendfile(sock.fileno(), f.fileno(), sent, min(STEP, size - sent))
                    if n == 0:
                        raise OSError(f"{file} ended after {sent} of its {size} bytes")
                    sent += n
                    progress(n)
            except (BrokenPipeError, ConnectionResetError):
                pass  # (the server answered early: its answer says why)
            return _response(sock, "PUT", url, stream=False)


@contextmanager
def get(http: httpx.Client, path: str, params: dict[str, Any]) -> Iterator[httpx.Response]:
    """GET `path`, its answer's body left to read (`chunks`) within the block."""
    sock, url = _connect(http, "GET", path, params, {"Accept-Encoding": "identity"})
    with sock:
        response = _response(sock, "GET", url, stream=True)
        try:
            yield response
        finally:
            response.extensions["raw"].close()


def spliceable(response: httpx.Response) -> bool:
    """Whether `save` can take this streamed answer: its length given (not chunked), where the kernel
    splices."""
    answer = response.extensions.get("raw")
    return (
        SPLICE
        and isinstance(answer, http.client.HTTPResponse)
        and not answer.chunked
        and answer.length is not None
    )


def save(response: httpx.Response, fd: int, progress: Callable[[int], None]) -> None:
    """A streamed answer's body written to the open file `fd`, moved from the socket to the file by the kernel
    (`os.splice` through a pipe: never copied into the program); what the answer's head was read with comes
    first. OSError for a connection that ends before the answer's length."""
    answer: http.client.HTTPResponse = response.extensions["raw"]
    left: int = answer.length or 0
    if left:
        head = answer.fp.read(min(left, len(answer.fp.peek(1))))  # (already read from the socket)
        write_all(fd, head)
        left -= len(head)
        progress(len(head))
    splice_exactly(answer.fp.fileno(), fd, left, progress)
    answer.length = 0


def write_all(fd: int, data: bytes | memoryview) -> None:
    """All of `data` written to the file `fd` (a write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def chunks(response: httpx.Response) -> Iterator[memoryview]:
    """A streamed answer's body as it comes, each piece a view of one reused buffer: valid until the next is
    asked for (write it, or copy it, before). OSError for a connection that ends before the answer's
    length."""
    answer: http.client.HTTPResponse = response.extensions["raw"]
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    while n := answer.readinto(buffer):
        yield view[:n]
    if answer.length:  # (http.client ends a body cut short quietly)
        raise OSError(f"the answer ended {answer.length} bytes before its length")
