"""The gateway on the Kubernetes backend (gateway/kubeaccess.py, kubeports.py), against the fake API
(tests/unit/services/executor/fake_kube_api.py) with a scripted pod exec stream: the replica's pod found by its
labels, a command's output and exit code, a terminal's size and type, a pod that is not running refused, a port
through the port-forward API (a local server stands for the pod's). Not verified here: a real API server's exec
and port-forward WebSockets (`ClientKubeApi.exec_stream`, `port_forward`), which tests on a cluster would reach
(docs/access.md)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from functools import partial
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from gpuyard.services.executor.gateway.app import gateway_app
from gpuyard.services.executor.gateway.kubeaccess import KubeAccess
from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.podexec import exit_status
from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.contracts.api.access import ExecStart
from tests.unit.services.executor.fake_kube_api import FakeKubeApi


class ScriptedStream:
    """An exec that writes `output` on its channels, then ends with `code`; what it was given is kept."""

    def __init__(self, output: list[tuple[int, bytes]], code: int):
        self.output = list(output)
        self.code = code
        self.sizes: list[tuple[int, int]] = []
        self.typed = b""
        self.open = True

    def read(self, timeout: float) -> list[tuple[int, bytes]]:
        frames, self.output = self.output, []
        if not frames:
            self.open = False
        return frames

    def write_stdin(self, data: bytes) -> None:
        self.typed += data

    def close_stdin(self) -> None:
        pass

    def resize(self, cols: int, rows: int) -> None:
        self.sizes.append((cols, rows))

    def is_open(self) -> bool:
        return self.open

    @property
    def returncode(self) -> int | None:
        return None if self.open else self.code

    def close(self) -> None:
        self.open = False


class ExecKubeApi(FakeKubeApi):
    def __init__(self) -> None:
        super().__init__()
        self.execs: list[tuple[str, str, list[str], bool]] = []
        self.stream = ScriptedStream([(1, b"out\n"), (2, b"err\n")], 3)
        self.forwards: list[tuple[str, int]] = []
        self.target = 0

    async def exec_stream(self, namespace, pod, container, argv, *, tty):
        self.execs.append((pod, container, argv, tty))
        return self.stream

    async def port_forward(self, namespace, pod, port):
        """A connection to a local server standing for the pod's port (`self.target`)."""
        self.forwards.append((pod, port))
        return socket.create_connection(("127.0.0.1", self.target))


def pod(api: ExecKubeApi, phase: str = "Running") -> None:
    api.pods["job-a1-r0"] = {
        "metadata": {"name": "job-a1-r0", "labels": job_labels.replica_selector("job1", 1, 0)},
        "spec": {},
        "status": {"phase": phase, "podIP": "10.1.2.3"},
    }


@pytest.fixture
def kube(tmp_path):
    api = ExecKubeApi()
    access = KubeAccess(SimpleNamespace(controller=SimpleNamespace(api=api, namespace="default")))
    token = GatewayToken(tmp_path / "gateway.token")
    with TestClient(gateway_app(token, access)) as client:
        yield api, access, client, {"authorization": f"Bearer {token.token().decode()}"}


def frames(client, headers, start: ExecStart, tty: bool) -> tuple[bytes, list[dict]]:
    output, controls = b"", []
    with client.websocket_connect(f"/v1/exec/job1/1/0?tty={int(tty)}", headers=headers) as ws:
        ws.send_text(start.to_json())
        while not controls:
            message = ws.receive()
            if message.get("bytes") is not None:
                output += message["bytes"]
            elif message.get("text") is not None:
                controls.append(json.loads(message["text"]))
    return output, controls


def test_a_command_runs_in_the_replicas_pod_with_its_output_and_code(kube):
    api, _, client, headers = kube
    pod(api)
    output, controls = frames(client, headers, ExecStart(argv=["ls", "-l"]), tty=False)
    assert (output, controls) == (b"\x01out\n\x02err\n", [{"exit": 3}])
    assert api.execs == [("job-a1-r0", "worker", ["ls", "-l"], False)]


def test_a_terminal_gets_its_type_and_size_and_a_shell_by_default(kube):
    api, _, client, headers = kube
    pod(api)
    frames(client, headers, ExecStart(argv=[], size=(120, 40), stdin=True), tty=True)
    [(_, _, argv, tty)] = api.execs
    assert tty and argv[:2] == ["env", "TERM=xterm-256color"] and argv[2] == "sh"
    assert api.stream.sizes[0] == (120, 40)


def test_a_pod_that_is_not_running_or_missing_is_refused_with_the_reason(kube):
    api, _, client, headers = kube
    _, controls = frames(client, headers, ExecStart(argv=["true"]), tty=False)
    assert controls == [{"error": "job job1 replica 0 has no pod"}]
    pod(api, phase="Pending")
    _, controls = frames(client, headers, ExecStart(argv=["true"]), tty=False)
    assert controls == [{"error": "job job1 replica 0's pod is Pending"}]
    answer = client.get("/v1/ports/job1/1/0/6006/", headers=headers)
    assert answer.status_code == 409 and "Pending" in answer.json()["detail"]


def test_a_port_is_reached_through_the_port_forward_api(kube, tmp_path):
    api, _, client, headers = kube
    pod(api)
    page = tmp_path / "page.txt"
    page.write_text("from the pod\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path)))
    api.target = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for _ in range(2):
            answer = client.get("/v1/ports/job1/1/0/6006/page.txt", headers=headers)
            assert (answer.status_code, answer.text) == (200, "from the pod\n")
        assert api.forwards[0] == ("job-a1-r0", 6006)
        missing = client.get("/v1/ports/job1/1/1/6006/page.txt", headers=headers)
        assert missing.status_code == 404 and "has no pod" in missing.json()["detail"]
    finally:
        server.shutdown()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_exit_code_is_read_from_the_exec_status():
    failure = {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}}
    assert (exit_status({"status": "Success"}), exit_status(failure), exit_status({"status": "Failure"})) == (
        0,
        42,
        1,
    )
