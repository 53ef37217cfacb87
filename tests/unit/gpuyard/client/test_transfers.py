"""Files up and down through the submit API's volume routes, as the CLI moves them (`gpuyard.transfers`): straight
through the socket to a plain http:// server (`gpuyard.rawhttp`: sendfile up, splice or readinto down) and through httpx
elsewhere (a proxy, https), the same bytes and the same answers either way: a refusal the server gives before
the body has come (413), a path not there (404), a tree unpacked."""

from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager

import pytest

from gpuyard import rawhttp, transfers
from gpuyard.client import Client, ClientError
from gpuyard.services.submit.app import create_app
from gpuyard.shared.runtime import splice
from tests.unit.services.submit.submitctx import served, submit_context

URL = "/v1/volumes/data/content"


@pytest.fixture(params=["socket", "httpx"])
def client(request, tmp_path, monkeypatch):
    """A client of a live API with a volume `data` of 100 kB, its transfers through the socket or httpx."""
    if request.param == "httpx":
        monkeypatch.setattr(rawhttp, "direct", lambda http: False)
    with submit_context(tmp_path, volumes=True) as ctx, served(create_app(ctx)) as server:
        client = Client(server, "tok-vision")
        client.request("POST", "/v1/volumes", json={"name": "data", "size": 100_000})
        yield client


def test_the_socket_is_taken_for_a_plain_http_server_without_a_proxy_only(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert rawhttp.direct(Client("http://127.0.0.1:1", "t").http)
    assert not rawhttp.direct(Client("https://127.0.0.1:1", "t").http)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert not rawhttp.direct(Client("http://10.1.2.3:8080", "t").http)


def test_a_file_goes_up_and_comes_down_whole_with_its_progress(client, tmp_path):
    data = os.urandom(70_000)
    (tmp_path / "w.bin").write_bytes(data)
    sent: list[int] = []
    answer = transfers.upload_file(
        client, URL, {"path": "d/w.bin"}, tmp_path / "w.bin", "application/octet-stream", sent.append
    )
    assert (answer["files"], answer["bytes"], sum(sent)) == (1, 70_000, 70_000)
    got: list[int] = []
    assert transfers.download(client, URL, {"path": "d/w.bin"}, tmp_path / "back.bin", got.append) == "file"
    assert (tmp_path / "back.bin").read_bytes() == data and sum(got) == 70_000
    assert transfers.download(client, URL, {"path": "d"}, tmp_path / "tree", lambda n: None) == "dir"
    assert (tmp_path / "tree" / "w.bin").read_bytes() == data


def test_a_file_over_the_room_left_is_refused_with_the_servers_reason(client, tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * 300_000)
    with pytest.raises(ClientError, match="does not fit"):
        transfers.upload_file(
            client, URL, {"path": "big.bin"}, tmp_path / "big.bin", "application/octet-stream", lambda n: None
        )
    assert client.request("GET", "/v1/volumes/data/files")["items"] == []


def test_a_path_not_there_is_the_servers_404_and_leaves_nothing(client, tmp_path):
    with pytest.raises(ClientError, match=r"no file or folder 'gone.bin'.*\(HTTP 404\)"):
        transfers.download(client, URL, {"path": "gone.bin"}, tmp_path / "gone.bin", lambda n: None)
    assert list(tmp_path.glob("*gone*")) == []


def test_a_server_that_is_not_there_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "f").write_bytes(b"1")
    client = Client(f"http://127.0.0.1:{port}", "t")
    with pytest.raises(ClientError, match="cannot reach GPUYARD"):
        transfers.upload_file(
            client, URL, {"path": "f"}, tmp_path / "f", "application/octet-stream", lambda n: None
        )
    with pytest.raises(ClientError, match="cannot reach GPUYARD"):
        transfers.download(client, URL, {"path": "f"}, tmp_path / "g", lambda n: None)


@contextmanager
def _answering(body: bytes, length: int):
    """A server on loopback that answers one request with `body` under a Content-Length of `length`, then
    closes the connection: its URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request and (more := conn.recv(65536)):
                request += more
            head = (
                f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n"
            )
            conn.sendall(head.encode() + b"\r\n" + body)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(10)
        listener.close()


@pytest.fixture(params=["splice", "readinto"])
def socket_way(request, monkeypatch):
    """A download through the socket, its bytes moved by the kernel (`os.splice`) or read into a buffer."""
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "readinto":
        monkeypatch.setattr(rawhttp, "SPLICE", False)
    return request.param


def test_a_download_larger_than_the_pipe_comes_whole_with_its_progress(socket_way, tmp_path):
    data = os.urandom(3 * splice.PIPE_SIZE + 12_345)
    got: list[int] = []
    with _answering(data, len(data)) as server:
        client = Client(server, "t")
        assert rawhttp.direct(client.http)
        assert transfers.download(client, URL, {"path": "f"}, tmp_path / "f", got.append) == "file"
    assert (tmp_path / "f").read_bytes() == data and sum(got) == len(data)


def test_a_download_cut_short_is_one_line_and_leaves_nothing(socket_way, tmp_path):
    with _answering(b"x" * 50_000, 100_000) as server, pytest.raises(ClientError, match="download"):
        transfers.download(Client(server, "t"), URL, {"path": "f"}, tmp_path / "f", lambda n: None)
    assert list(tmp_path.iterdir()) == []
