"""A submit whose answer is lost on the way back (the server accepted the job, then the connection dropped)
is sent again by the CLI with the same Idempotency-Key, and one job is queued; the key still names the job
after the submit service was killed and restarted."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading

import pytest

from gpuyard.client import Client, ClientError
from gpuyard.shared.contracts.jobstate import JobState

from .conftest import wait_for

pytestmark = pytest.mark.integration
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def read_message(sock: socket.socket, buffer: bytearray) -> bytes | None:
    """One HTTP/1.1 message (headers and a Content-Length body) from `sock`; None when it closes first."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    head_end = buffer.index(b"\r\n\r\n") + 4
    length = CONTENT_LENGTH.search(bytes(buffer[:head_end]))
    end = head_end + (int(length.group(1)) if length else 0)
    while len(buffer) < end:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    message = bytes(buffer[:end])
    del buffer[:end]
    return message


class LosingProxy:
    """A TCP proxy to the API that drops the answer to the first POST /v1/jobs: the request reaches the server
    and is answered there, then the client's connection is closed without that answer."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lost: list[bytes] = []  # the answers the client never got
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.relay, args=(client,), daemon=True).start()

    def relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        inbound, outbound = bytearray(), bytearray()
        try:
            while (request := read_message(client, inbound)) is not None:
                upstream.sendall(request)
                answer = read_message(upstream, outbound)
                if answer is None:
                    return
                if request.startswith(b"POST /v1/jobs ") and not self.lost:
                    self.lost.append(answer)
                    return  # the connection drops: the client sees no answer
                client.sendall(answer)
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.listener.close()


def test_the_cli_sends_again_with_the_same_key_and_one_job_is_queued(platform, tmp_path):
    proxy = LosingProxy(platform.port)
    spec = tmp_path / "once.json"
    spec.write_text(json.dumps({"name": "exactly-once", "command": "true", "resources": {"gpus": 0.5}}))
    try:
        result = platform.cli("submit", str(spec), "--server", proxy.url, "--json")
    finally:
        proxy.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trying again" in result.stderr  # the first answer was lost, and the CLI said so
    [lost] = proxy.lost
    first = json.loads(lost.split(b"\r\n\r\n", 1)[1])  # what the server had answered to the first try
    answer = json.loads(result.stdout)
    assert lost.startswith(b"HTTP/1.1 202") and not first["duplicate"]
    assert answer["job_id"] == first["job_id"] and answer["duplicate"]
    client = platform.client()
    named = [j for j in client.jobs(limit=500).items if j.name == "exactly-once"]
    assert [j.job_id for j in named] == [first["job_id"]]
    assert platform.wait_state(first["job_id"], {"succeeded"}).state == JobState.SUCCEEDED


def test_the_key_names_its_job_after_the_submit_service_restarts(platform):
    client = platform.client()
    spec = {"name": "keyed", "command": "true", "resources": {"gpus": 0.5}}
    first = client.submit(spec, idempotency_key="restart-key-1")
    submit = next(s for s in client.services() if s.service == "submit")
    os.kill(submit.pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return any(s.service == "submit" and s.pid != submit.pid for s in client.services())
        except ClientError:  # still down (the client tried a few times)
            return False

    wait_for(restarted, 60, 0.5, "the submit service back")
    again = Client(platform.server, client.token).submit(spec, idempotency_key="restart-key-1")
    assert again.job_id == first.job_id and again.duplicate
    with pytest.raises(
        ClientError, match=r"Idempotency-Key 'restart-key-1' was used for another request.*409"
    ):
        client.submit({**spec, "command": "false"}, idempotency_key="restart-key-1")
    assert sum(j.name == "keyed" for j in client.jobs(limit=500).items) == 1
