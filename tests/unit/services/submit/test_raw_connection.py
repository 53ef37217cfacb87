"""A volume's files moved by the kernel between the socket and the file (services/submit/rawconnection.py), over
the real server (uvicorn in a thread). Up: a body of a stated length is spliced from the socket to the file, what
the server had already read first, and the answer closes the connection; a chunked body goes through the ASGI
path; a client that waits for `100 Continue` gets it; a client that goes away midway leaves nothing, and the
server answers the next request. Down: a file is sent with `sendfile`, whole, and the connection stays open for
the next request; a client that goes away midway leaves the server answering, and a send that breaks ends its
connection with nothing logged as an error."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import httpx
import pytest

from gpuyard.services.submit import rawconnection
from gpuyard.services.submit.app import create_app
from gpuyard.shared.runtime import splice
from tests.unit.services.submit.submitctx import served, submit_context

URL = "/v1/volumes/data/content"
AUTH = {"Authorization": "Bearer tok-vision"}
TIMEOUT = 60.0
"""How long a request may take before the test fails (a bound on a hang on a loaded machine, not a speed)."""
SIZE = 3 * splice.PIPE_SIZE + 12_345
"""Larger than the pipe the kernel moves the bytes through: several moves."""


@pytest.fixture
def api(tmp_path):
    """(the URL of a live API with a volume `data` of 100 MB, its storage root)."""
    with submit_context(tmp_path, volumes=True) as ctx, served(create_app(ctx)) as server:
        created = httpx.post(
            f"{server}/v1/volumes", json={"name": "data", "size": 100_000_000}, headers=AUTH, timeout=TIMEOUT
        )
        assert created.status_code == 201, created.text
        yield server, tmp_path / "storage"


@pytest.fixture
def taken(monkeypatch) -> list[int]:
    """The lengths of the bodies taken off their sockets."""
    lengths: list[int] = []
    take_body = rawconnection.RawConnection.take_body

    async def counted(self, length, staging):
        lengths.append(length)
        return await take_body(self, length, staging)

    monkeypatch.setattr(rawconnection.RawConnection, "take_body", counted)
    return lengths


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """The sizes of the files the kernel sent to a socket."""
    sizes: list[int] = []
    send_file = rawconnection.RawConnection.send_file

    async def counted(self, send, start, fd, size):
        done = await send_file(self, send, start, fd, size)
        if done:
            sizes.append(size)
        return done

    monkeypatch.setattr(rawconnection.RawConnection, "send_file", counted)
    return sizes


def volume_file(root: Path, name: str) -> bytes:
    return next(root.glob(f"volumes/*/data/{name}")).read_bytes()


def staged(root: Path) -> list[Path]:
    return list(root.glob("volumes/*/.uploads/*"))


def test_a_body_of_a_stated_length_is_moved_by_the_kernel_and_the_connection_closes(api, taken):
    server, root = api
    data = os.urandom(SIZE)
    with httpx.Client(base_url=server, headers=AUTH, timeout=TIMEOUT) as http:
        answer = http.put(URL, params={"path": "d/big.bin"}, content=data)
        assert answer.status_code == 201, answer.text
        assert answer.headers["connection"] == "close"
        listing = http.get("/v1/volumes/data/files", params={"path": "d"})  # (on a new connection)
        assert listing.status_code == 200
    assert answer.json()["bytes"] == SIZE and taken == [SIZE]
    assert volume_file(root, "d/big.bin") == data and staged(root) == []


def test_a_chunked_body_goes_through_the_asgi_path(api, taken):
    server, root = api
    data = os.urandom(SIZE)
    answer = httpx.put(
        f"{server}{URL}",
        params={"path": "c.bin"},
        content=(data[i : i + 100_000] for i in range(0, SIZE, 100_000)),
        headers=AUTH,
        timeout=TIMEOUT,
    )
    assert answer.status_code == 201, answer.text
    assert taken == [] and volume_file(root, "c.bin") == data


def head(server: str, path: str, length: int, *extra: str) -> tuple[socket.socket, bytes]:
    """A connection to the API with an upload's head sent: (the socket, the head)."""
    port = int(server.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    lines = [
        f"PUT {URL}?path={path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Authorization: Bearer tok-vision",
        f"Content-Length: {length}",
        *extra,
    ]
    return sock, ("\r\n".join(lines) + "\r\n\r\n").encode()


def first_bytes(sock: socket.socket, n: int) -> bytes:
    """The first `n` bytes the server sends (as many reads as they take)."""
    sock.settimeout(TIMEOUT)
    got = b""
    while len(got) < n and (more := sock.recv(n - len(got))):
        got += more
    return got


def upload(server: str, path: str, data: bytes) -> httpx.Response:
    """`data` put into the volume at `path` on a connection of its own."""
    return httpx.put(f"{server}{URL}", params={"path": path}, content=data, headers=AUTH, timeout=TIMEOUT)


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(TIMEOUT)
    got = b""
    while more := sock.recv(65536):
        got += more
    return got


def test_a_client_that_waits_for_100_continue_gets_it_then_its_body_is_taken(api, taken):
    server, root = api
    data = os.urandom(SIZE)
    sock, request = head(server, "e.bin", SIZE, "Expect: 100-continue")
    with sock:
        sock.sendall(request)
        assert first_bytes(sock, 25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(data)
        assert answer_of(sock).split(b"\r\n", 1)[0].startswith(b"HTTP/1.1 201")
    assert taken == [SIZE] and volume_file(root, "e.bin") == data


def test_a_client_gone_midway_leaves_nothing_and_the_server_answers_the_next(api, taken):
    server, root = api
    sock, request = head(server, "gone.bin", SIZE)
    with sock:
        sock.sendall(request + b"x" * (SIZE // 2))  # (the server takes the body while it comes)
        sock.shutdown(socket.SHUT_WR)
        assert b" 400 " in answer_of(sock).split(b"\r\n", 1)[0] + b" "  # (ended before its last byte)
    assert taken == [SIZE] and staged(root) == []
    listing = httpx.get(f"{server}/v1/volumes/data/files", headers=AUTH, timeout=TIMEOUT)
    assert listing.status_code == 200 and listing.json()["items"] == []


def test_a_file_is_sent_by_the_kernel_whole_and_the_connection_serves_the_next_request(api, sent):
    server, root = api
    data = os.urandom(SIZE)
    with httpx.Client(base_url=server, headers=AUTH, timeout=TIMEOUT) as http:
        assert http.put(URL, params={"path": "f.bin"}, content=data).status_code == 201
        for _ in range(2):  # (the second on the same connection)
            answer = http.get(URL, params={"path": "f.bin"})
            assert answer.status_code == 200 and answer.content == data
            assert answer.headers["content-length"] == str(SIZE) and "close" not in answer.headers.get(
                "connection", ""
            )
    assert sent == [SIZE, SIZE]


def test_a_client_gone_during_a_download_leaves_the_server_answering(api, sent):
    server, root = api
    data = os.urandom(48 * splice.PIPE_SIZE)  # (more than the sockets' buffers hold)
    assert upload(server, "g.bin", data).status_code == 201
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        request = f"GET {URL}?path=g.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-vision\r\n\r\n"
        sock.sendall(request.encode())
        assert first_bytes(sock, 12) == b"HTTP/1.1 200"
    again = httpx.get(f"{server}{URL}", params={"path": "g.bin"}, headers=AUTH, timeout=TIMEOUT)
    assert again.status_code == 200 and again.content == data


def test_a_download_broken_midway_ends_its_connection_without_an_error_logged(api, sent, monkeypatch, caplog):
    server, root = api
    assert upload(server, "b.bin", b"x" * 100_000).status_code == 201

    def broken(*args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(os, "sendfile", broken)
    caplog.set_level(logging.WARNING)
    with pytest.raises(httpx.HTTPError):  # (the head came, the connection ended before the body)
        httpx.get(f"{server}{URL}", params={"path": "b.bin"}, headers=AUTH, timeout=TIMEOUT)
    assert httpx.get(f"{server}/v1/volumes/data/files", headers=AUTH, timeout=TIMEOUT).status_code == 200
    assert sent == [100_000]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
