"""Files up and down through the submit API's volume routes, as the CLI moves them (`gpuyard.transfers`): straight
through the socket to a plain http:// server (`gpuyard.rawhttp`: sendfile up, readinto down) and through httpx
elsewhere (a proxy, https), the same bytes and the same answers either way: a refusal the server gives before
the body has come (413), a path not there (404), a tree unpacked."""

from __future__ import annotations

import os
import socket

import pytest

from gpuyard import rawhttp, transfers
from gpuyard.client import Client, ClientError
from gpuyard.services.submit.app import create_app
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
