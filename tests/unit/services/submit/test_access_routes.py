"""The submit service's way into running jobs (routes_exec.py, routes_ports.py, jobproxy.py), in process, through
a real executor gateway on a free port (services/executor/gateway/) to a stand-in replica: the caller checked on
every request and every WebSocket upgrade (401, 404 for another tenant's job, 409 for a job not running, 404 for
an unlisted port or a replica the job lacks, 503 for a node without a gateway), and the caller's credentials never
reaching the job."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from gpuyard.services.executor.gateway.access import LocalAccess
from gpuyard.services.executor.gateway.server import Gateway
from gpuyard.services.submit import fastproxy
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.fastproxy import route_of
from gpuyard.services.submit.jobproxy import JobProxy
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.contracts.api.access import ExecStart
from gpuyard.shared.contracts.events.jobs import JobPlaced, JobStarted, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.settings.gateway import GatewaySettings
from gpuyard.supervisor.ports import free_ports
from tests.unit.services.executor.gateway.replica import start_replica
from tests.unit.services.submit.submitctx import TOKENS, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
NODE = "node-a"


@pytest.fixture
def gateway(tmp_path):
    """A gateway serving the data dir `tmp_path / "node"` in a thread of its own; its URL and token."""
    settings = GatewaySettings(data_dir=tmp_path / "node", gateway_token_file=tmp_path / "gateway.token")
    server = Gateway(settings, LocalAccess(tmp_path / "node", NODE), address="127.0.0.1")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    while not server.server.started:
        time.sleep(0.01)
    yield server.url, GatewayToken(settings.gateway_token_path, make=False)
    server.stop()
    thread.join(10)


@pytest.fixture
def setup(tmp_path, gateway):
    url, token = gateway
    with submit_context(tmp_path / "api", TOKENS, session_secret=b"k" * 32) as ctx:
        app = create_app(ctx)
        app.state.job_proxy = JobProxy(token)
        ctx.telemetry.nodes[NODE] = (
            time.time(),
            NodeHeartbeat(node=NODE, gpus=[], cpus=4, memory_bytes=64 << 30, gateway=url),
        )
        with TestClient(app) as api:
            yield api, ctx, tmp_path / "node"


def running_job(api, ctx, ports: list[int]) -> str:
    answer = api.post("/v1/jobs", json={"command": "serve", "ports": ports}, headers=VISION)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]
    placed = [ReplicaPlacement(replica=0, node=NODE)]
    asyncio.run(ctx.ledger.append(job_id, JobPlaced(job_id=job_id, attempt=1, placements=placed)))
    asyncio.run(ctx.ledger.append(job_id, JobStarted(job_id=job_id, attempt=1, node=NODE, replicas=[0])))
    return job_id


def denied(api, path: str, headers: dict | None = None) -> tuple[int, str]:
    with (
        pytest.raises(WebSocketDenialResponse) as refused,
        api.websocket_connect(path, headers=headers or {}),
    ):
        pass
    return refused.value.status_code, refused.value.json()["detail"]


def test_exec_through_the_gateway_returns_the_commands_output_and_code(setup):
    api, ctx, data_dir = setup
    replica = start_replica(data_dir, NODE, job_id := running_job(api, ctx, []))
    try:
        output, controls = b"", []
        with api.websocket_connect(f"/v1/jobs/{job_id}/exec?replica=0", headers=VISION) as ws:
            ws.send_text(ExecStart(argv=["sh", "-c", "echo $CUDA_VISIBLE_DEVICES; exit 6"]).to_json())
            while not controls:
                message = ws.receive()
                if message.get("bytes") is not None:
                    output += message["bytes"][1:]
                elif message.get("text") is not None:
                    controls.append(json.loads(message["text"]))
        assert (output, controls) == (b"3\n", [{"exit": 6}])
    finally:
        replica.end()


def test_every_upgrade_and_request_checks_the_caller_and_the_job(setup):
    api, ctx, _ = setup
    job_id = running_job(api, ctx, [6006])
    assert denied(api, f"/v1/jobs/{job_id}/exec") == (
        401,
        "missing bearer token: send 'Authorization: Bearer <token>' (or log in to the dashboard)",
    )
    assert denied(api, f"/v1/jobs/{job_id}/exec", NLP) == (404, f"no job {job_id!r}")
    assert denied(api, f"/v1/jobs/{job_id}/exec?replica=2", VISION)[0] == 404
    assert denied(api, f"/v1/jobs/{job_id}/exec?tty=yes", VISION)[0] == 400
    assert denied(api, f"/jobs/{job_id}/ports/6006/ws", NLP)[0] == 404
    assert denied(api, f"/jobs/{job_id}/ports/7007/ws", VISION)[0] == 404
    plain = api.get(f"/v1/jobs/{job_id}/exec", headers=VISION)
    assert plain.status_code == 426 and "is a WebSocket" in plain.json()["detail"]
    assert api.get(f"/v1/jobs/{job_id}/exec", headers=NLP).status_code == 404
    assert api.get(f"/jobs/{job_id}/ports/6006/", headers=NLP).status_code == 404
    assert api.get(f"/jobs/{job_id}/ports/6006/").status_code == 401
    unlisted = api.get(f"/jobs/{job_id}/ports/7007/", headers=VISION)
    assert unlisted.status_code == 404 and "lists: 6006" in unlisted.json()["detail"]
    queued = api.post("/v1/jobs", json={"command": "x", "ports": [6006]}, headers=VISION).json()["job_id"]
    status, detail = denied(api, f"/v1/jobs/{queued}/exec", VISION)
    assert (status, detail) == (409, f"job {queued} is queued: only a running job can be reached")
    assert api.get(f"/jobs/{queued}/ports/6006/", headers=VISION).status_code == 409
    ctx.telemetry.nodes[NODE] = (
        time.time(),
        NodeHeartbeat(node=NODE, gpus=[], cpus=4, memory_bytes=64 << 30),
    )
    assert denied(api, f"/v1/jobs/{job_id}/exec", VISION)[0] == 503


def test_a_port_is_reached_by_http_and_websocket_and_the_callers_credentials_stay_behind(setup):
    api, ctx, data_dir = setup
    port = free_ports("127.0.0.1", 1)[0]
    job_id = running_job(api, ctx, [port])
    replica = start_replica(data_dir, NODE, job_id, port=port)
    try:
        answer = api.get(f"/jobs/{job_id}/ports/{port}/a/b?x=1", headers=VISION)
        assert answer.status_code == 200, answer.text
        assert answer.text == "path=/a/b?x=1 auth=None cookie=None"
        assert "set-cookie" not in answer.headers  # (the job's answer may not set the dashboard's session)
        token_id = next(e.id for e in ctx.tokens.entries() if e.tenant == "vision")
        cookie, _ = sessions.issue(ctx.session_secret, token_id, 3600)
        api.cookies.set(sessions.COOKIE, cookie)
        api.cookies.set("theirs", "kept")
        seen = api.get(f"/jobs/{job_id}/ports/{port}/")
        assert seen.status_code == 200 and seen.text == "path=/ auth=None cookie=theirs=kept", seen.text
        foreign = api.post(f"/jobs/{job_id}/ports/{port}/", headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        with api.websocket_connect(f"/jobs/{job_id}/ports/{port}/echo") as ws:
            ws.send_text("hello")
            assert ws.receive_text() == "hello"
    finally:
        replica.end()


def test_a_body_to_a_jobs_port_streams_on_past_the_apis_own_limit(setup):
    """The API's `max_body_bytes` is for its own routes: a large body to a job's port (a notebook's upload) is
    not refused by it, and reaches the route (here: 404, no such job); the same body to a route of the API's is
    413."""
    api, ctx, _ = setup
    body = b"x" * (ctx.max_body_bytes + 1)
    to_port = api.post("/jobs/0123456789abcdef/ports/8888/api/contents", content=body, headers=VISION)
    assert to_port.status_code == 404, to_port.text
    to_api = api.post("/v1/jobs", content=body, headers={**VISION, "Content-Type": "application/json"})
    assert to_api.status_code == 413, to_api.text


def test_the_fast_proxy_takes_the_job_routes_and_answers_as_the_apps_routes(setup, monkeypatch):
    """`fastproxy.FastProxy` calls the routes' own functions without FastAPI's routing: every answer here is the
    same with it and without it (an app whose middleware leaves it out), and it took the requests it may take."""
    api, ctx, data_dir = setup
    port = free_ports("127.0.0.1", 1)[0]
    job_id = running_job(api, ctx, [port])
    replica = start_replica(data_dir, NODE, job_id, port=port)
    slow_app = create_app(ctx)
    slow_app.state.job_proxy = JobProxy(api.app.state.job_proxy.token)  # (its own pool: its own event loop)
    slow_app.user_middleware = [m for m in slow_app.user_middleware if m.cls is not fastproxy.FastProxy]
    taken = []
    monkeypatch.setattr(fastproxy, "route_of", lambda path: taken.append(path) or route_of(path))
    asks = [
        ("GET", f"/jobs/{job_id}/ports/{port}/a?x=1", VISION),
        ("POST", f"/jobs/{job_id}/replicas/0/ports/{port}/b", VISION),
        ("GET", f"/jobs/{job_id}/replicas/1/ports/{port}/", VISION),
        ("GET", f"/jobs/{job_id}/ports/{port}/", NLP),
        ("GET", f"/jobs/{job_id}/ports/{port}/", {}),
        ("GET", f"/jobs/{job_id}/ports/7007/", VISION),
        ("GET", f"/jobs/{job_id}/ports/0/", VISION),
        ("GET", f"/jobs/{job_id}/ports/65536/", VISION),
        ("TRACE", f"/jobs/{job_id}/ports/{port}/", VISION),
        ("GET", f"/dev/{job_id}/api/status", VISION),
        ("GET", "/dev/not%20an%20id/api", VISION),
    ]
    try:
        with TestClient(slow_app) as slow:
            for method, path, headers in asks:
                fast_answer = api.request(method, path, headers=headers)
                slow_answer = slow.request(method, path, headers=headers)
                assert (fast_answer.status_code, fast_answer.content) == (
                    slow_answer.status_code,
                    slow_answer.content,
                ), f"{method} {path}"
    finally:
        replica.end()
    assert (
        len([p for p in taken if route_of(p) is not None]) == 7
    )  # (not the bad ports, TRACE nor the bad id)
