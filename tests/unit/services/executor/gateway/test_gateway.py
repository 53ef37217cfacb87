"""The executor gateway (services/executor/gateway/) in process, against a stand-in replica of the local backend
(`replica.py`): its token, an exec in the replica's environment and directory with its exit code, a terminal,
ports forwarded only where the replica itself listens, and a session that ends with its replica."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from gpuyard.services.executor.gateway.access import LocalAccess
from gpuyard.services.executor.gateway.app import gateway_app
from gpuyard.services.executor.gateway.listeners import Listeners, host_of
from gpuyard.services.executor.gateway.replicas import LocalReplicas, NoReplica, ReplicaKey
from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.contracts.api.access import ExecStart
from tests.unit.services.executor.gateway.replica import start_replica

NODE = "node-a"


@pytest.fixture
def setup(tmp_path):
    token = GatewayToken(tmp_path / "secrets" / "gateway.token")
    replica = start_replica(tmp_path, NODE, "job1")
    app = gateway_app(token, LocalAccess(tmp_path, NODE))
    with TestClient(app) as client:
        yield client, {"authorization": f"Bearer {token.token().decode()}"}, replica
    replica.end()


def session(client, headers, argv, *, tty=False, job="job1", replica=0):
    """The frames the gateway sends for `argv`: (output bytes, control documents)."""
    output, controls = b"", []
    with client.websocket_connect(f"/v1/exec/{job}/1/{replica}?tty={int(tty)}", headers=headers) as ws:
        ws.send_text(ExecStart(argv=argv, stdin=tty).to_json())
        if tty:
            ws.send_bytes(b"\x00tty; echo TERM=$TERM; exit 4\n")
        while True:
            try:
                message = ws.receive()
            except WebSocketDisconnect:
                break
            if message["type"] == "websocket.close":
                break
            if message.get("bytes") is not None:
                output += message["bytes"][1:]
            elif message.get("text") is not None:
                controls.append(json.loads(message["text"]))
    return output, controls


def test_every_request_needs_the_gateway_token(setup, tmp_path):
    client, headers, replica = setup
    assert client.get("/healthz").status_code == 200
    assert client.get(f"/v1/ports/job1/1/0/{replica.port}/").status_code == 401
    assert (
        client.get(
            f"/v1/ports/job1/1/0/{replica.port}/", headers={"authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    with pytest.raises(WebSocketDenialResponse) as refused, client.websocket_connect("/v1/exec/job1/1/0"):
        pass
    assert refused.value.status_code == 401
    assert (tmp_path / "secrets" / "gateway.token").stat().st_mode & 0o077 == 0


def test_exec_runs_in_the_replicas_directory_and_environment_and_returns_its_code(setup):
    client, headers, replica = setup
    output, controls = session(
        client, headers, ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $RANK $(pwd)"; exit 3']
    )
    assert output.decode() == f"3 0 {replica.cwd}\n"
    assert controls == [{"exit": 3}]


def test_a_terminal_is_a_pty_with_the_terminal_type_asked_for(setup):
    client, headers, _ = setup
    output, controls = session(client, headers, ["sh"], tty=True)
    assert b"/dev/pts/" in output and b"TERM=xterm-256color" in output, output
    assert controls == [{"exit": 4}]


def test_a_replica_that_is_not_here_or_has_ended_is_refused_with_the_reason(setup, tmp_path):
    client, headers, replica = setup
    _, controls = session(client, headers, ["true"], replica=1)
    assert controls == [{"error": "job job1 replica 1 does not run on node node-a"}]
    _, controls = session(client, headers, ["no-such-command-here"])
    assert controls == [{"error": "command not found: no-such-command-here (not in the PATH)"}]
    replica.end()
    _, controls = session(client, headers, ["true"])
    assert controls == [{"error": "job job1 replica 0 has ended"}]
    with pytest.raises(NoReplica, match="no job .. replica 0"):
        LocalReplicas(tmp_path, NODE).find(ReplicaKey("..", 1, 0))  # (never a path outside the data dir)


def test_a_port_is_forwarded_only_where_the_replica_itself_listens(setup, tmp_path):
    client, headers, replica = setup
    target = LocalAccess(tmp_path, NODE).replicas.running(ReplicaKey("job1", 1, 0))
    assert Listeners().host(target, replica.port) == "127.0.0.1"
    other = start_replica(tmp_path, NODE, "job2")  # another job's server on the same node
    try:
        assert Listeners().host(target, other.port) is None
        refused = client.get(f"/v1/ports/job1/1/0/{other.port}/", headers=headers)
        assert refused.status_code == 404 and "listens on port" in refused.json()["detail"]
    finally:
        other.end()
    assert host_of("00000000") == "127.0.0.1" and host_of("0100007F") == "127.0.0.1"
    assert host_of("0A00000B") == "11.0.0.10" and host_of("0" * 32) == "[::1]"
