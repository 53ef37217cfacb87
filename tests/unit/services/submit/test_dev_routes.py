"""Dev environments in the submit service (routes_dev.py, devhome.py), in process, through a real executor
gateway to a stand-in replica listening on the environment's derived port: start, list, stop; the proxy adds
the notebook token (never the caller's credentials), and refuses another tenant (403), no credentials (401), an
environment not running (409) and a job that is no dev environment (404), on HTTP and on the WebSocket upgrade;
the user's activity (a kernel's or terminal's messages, a request that changes something) is noted, JupyterLab's
polling is not."""

from __future__ import annotations

import asyncio
import time

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.devactivity import ActivityNotes
from gpuyard.services.submit.devhome import home_volume_name
from gpuyard.services.submit.jobproxy import JobProxy
from gpuyard.shared.auth.devtoken import dev_port, dev_token
from gpuyard.shared.auth.jobtokens import ensure_secret
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.jobs import JobFailed, JobPlaced, JobStarted, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from tests.unit.services.executor.gateway.replica import start_replica
from tests.unit.services.submit.submitctx import TOKENS, submit_context
from tests.unit.services.submit.test_access_routes import NLP, NODE, VISION, denied, gateway  # noqa: F401

__all__ = ["gateway"]


@pytest.fixture
def setup(tmp_path, gateway):  # noqa: F811
    url, token = gateway
    secret_file = tmp_path / "publish.key"
    secret = ensure_secret(secret_file)
    with submit_context(tmp_path / "api", TOKENS, volumes=True, publish_secret_file=secret_file) as ctx:
        app = create_app(ctx)
        app.state.job_proxy = JobProxy(token)
        ctx.telemetry.nodes[NODE] = (
            time.time(),
            NodeHeartbeat(node=NODE, gpus=[], cpus=4, memory_bytes=64 << 30, gateway=url),
        )
        with TestClient(app) as api:
            yield api, ctx, tmp_path / "node", secret


def run(ctx, job_id: str) -> None:
    placed = [ReplicaPlacement(replica=0, node=NODE)]
    asyncio.run(ctx.ledger.append(job_id, JobPlaced(job_id=job_id, attempt=1, placements=placed)))
    asyncio.run(ctx.ledger.append(job_id, JobStarted(job_id=job_id, attempt=1, node=NODE, replicas=[0])))


def test_start_list_stop_and_the_notebook_volume(setup):
    api, _, _, _ = setup
    answer = api.post("/v1/dev", json={"name": "explore"}, headers=VISION)
    assert answer.status_code == 202, answer.text
    dev = answer.json()
    assert dev["state"] == "queued" and dev["url"] == f"/dev/{dev['job_id']}/lab" and dev["gpus"] == 0
    assert dev["idle_timeout"] == 7200 and dev["notebooks"] == "dev-ana"
    job = api.get(f"/v1/jobs/{dev['job_id']}", headers=VISION).json()
    assert job["spec"]["dev"] == {"root": "notebooks"} and job["spec"]["command"] is None
    assert job["spec"]["volumes"] == [{"name": "dev-ana", "path": "notebooks", "read_only": False}]
    assert [v["name"] for v in api.get("/v1/volumes", headers=VISION).json()["items"]] == ["dev-ana"]
    again = api.post("/v1/dev", json={"idle_timeout": "off"}, headers=VISION).json()
    assert again["notebooks"] == "dev-ana" and again["idle_timeout"] is None  # the same volume
    listed = api.get("/v1/dev", headers=VISION).json()["items"]
    assert {d["job_id"] for d in listed} == {dev["job_id"], again["job_id"]}
    assert api.get("/v1/dev", headers=NLP).json()["items"] == []
    assert api.delete(f"/v1/dev/{dev['job_id']}", headers=NLP).status_code == 404
    stopped = api.delete(f"/v1/dev/{dev['job_id']}", headers=VISION)
    assert stopped.status_code == 200 and stopped.json()["state"] == "cancelled"
    plain = api.post("/v1/jobs", json={"command": "x"}, headers=VISION).json()["job_id"]
    assert api.delete(f"/v1/dev/{plain}", headers=VISION).status_code == 404
    refused = api.post("/v1/dev", json={"command": "x"}, headers=VISION)
    assert refused.status_code == 422


def test_the_proxy_adds_the_notebook_token_and_checks_every_caller(setup):
    api, ctx, data_dir, secret = setup
    job_id = api.post("/v1/dev", json={}, headers=VISION).json()["job_id"]
    assert api.get(f"/dev/{job_id}/api/status", headers=VISION).status_code == 409
    assert denied(api, f"/dev/{job_id}/api/kernels/k/channels", VISION)[0] == 409
    run(ctx, job_id)
    elsewhere = start_replica(data_dir, NODE, job_id)  # (running, its JupyterLab not listening yet)
    try:
        starting = api.get(f"/dev/{job_id}/lab", headers={**VISION, "Accept": "text/html"})
        assert starting.status_code == 503 and "is starting" in starting.text
        assert api.get(f"/dev/{job_id}/api/status", headers=VISION).status_code == 404  # (not a page)
    finally:
        elsewhere.end()
    replica = start_replica(data_dir, NODE, job_id, port=dev_port(secret, job_id, 1))
    try:
        seen = api.get(f"/dev/{job_id}/api/status?x=1", headers={**VISION, "Origin": "https://elsewhere"})
        assert seen.status_code == 200
        assert (
            seen.text
            == f"path=/dev/{job_id}/api/status?x=1&token={dev_token(secret, job_id, 1)} auth=None cookie=None"
        )
        with api.websocket_connect(f"/dev/{job_id}/api/kernels/k/channels", headers=VISION) as ws:
            ws.send_text("ping")
            assert ws.receive_text() == "ping"
    finally:
        replica.end()
    assert api.get(f"/dev/{job_id}/api/status", headers=NLP).status_code == 403
    assert denied(api, f"/dev/{job_id}/api/kernels/k/channels", NLP)[0] == 403
    assert api.get(f"/dev/{job_id}/api/status").status_code == 401
    assert denied(api, f"/dev/{job_id}/api/kernels/k/channels")[0] == 401
    page = api.get(f"/dev/{job_id}/lab", headers={"Accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == f"/?next=/dev/{job_id}/lab"
    assert api.get("/dev/nothing/api/status", headers=VISION).status_code == 404
    plain = api.post("/v1/jobs", json={"command": "x"}, headers=VISION).json()["job_id"]
    assert api.get(f"/dev/{plain}/api/status", headers=VISION).status_code == 404


def published_soon(published: list, count: int) -> list:
    deadline = time.monotonic() + 10
    while len(published) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(published) == count, published
    return published


def test_the_users_activity_is_noted_and_jupyterlabs_polling_is_not(setup):
    api, ctx, data_dir, secret = setup
    published: list = []

    async def publish(event) -> None:
        published.append(event)

    notes = api.app.state.dev_activity = ActivityNotes(publish, "/gpuyard/submit/test")
    job_id = api.post("/v1/dev", json={}, headers=VISION).json()["job_id"]
    run(ctx, job_id)
    replica = start_replica(data_dir, NODE, job_id, port=dev_port(secret, job_id, 1))
    try:
        assert api.get(f"/dev/{job_id}/api/status", headers=VISION).status_code == 200
        with api.websocket_connect(f"/dev/{job_id}/api/events/subscribe", headers=VISION) as ws:
            ws.send_text("an event")
            assert ws.receive_text() == "an event"
        assert job_id not in notes.noted  # (noted before the answer, or the echo, comes back)
        api.post(f"/dev/{job_id}/api/contents/x.ipynb", headers=VISION)  # (its answer is the stand-in's)
        event = published_soon(published, 1)[0]
        assert (event.data.job_id, event.data.attempt, event.data.tenant) == (job_id, 1, "vision")
        for path in ("api/kernels/k/channels", "terminals/websocket/1"):
            notes.noted.clear()
            with api.websocket_connect(f"/dev/{job_id}/{path}", headers=VISION) as ws:
                for text in ("a", "b", "c"):
                    ws.send_text(text)
                    assert ws.receive_text() == text
            assert notes.noted[job_id].attempt == 1
        assert len(published_soon(published, 3)) == 3  # (one for each: the three messages in one minute)
    finally:
        replica.end()


def test_a_failed_start_says_its_own_line(setup):
    api, ctx, _, _ = setup
    job_id = api.post("/v1/dev", json={}, headers=VISION).json()["job_id"]
    run(ctx, job_id)
    line = (
        "gpuyard dev: JupyterLab is not installed for python on node node-a: pip install 'gpuyard[dev]' there"
    )
    failed = JobFailed(
        job_id=job_id, attempt=1, reason="exit_code", message="replica 0: exited with code 3", exit_code=3,
        log_tail=["something", line],
    )  # fmt: skip
    asyncio.run(ctx.ledger.append(job_id, failed))
    dev = api.get(f"/v1/dev/{job_id}", headers=VISION).json()
    assert dev["state"] == "failed"
    assert dev["message"] == "replica 0: exited with code 3: " + line.removeprefix("gpuyard dev: ")


def test_home_volume_names_fit_and_differ():
    assert home_volume_name(Principal(tenant="vision", user="ana")) == "dev-ana"
    odd = home_volume_name(Principal(tenant="vision", user="Ana.Lopez@lab"))
    assert odd.startswith("dev-ana-lopez-lab-") and odd != home_volume_name(
        Principal(tenant="v", user="ana-lopez-lab")
    )
    assert home_volume_name(Principal(tenant="vision")) == "dev-vision"
    assert len(home_volume_name(Principal(tenant="t", user="x" * 200))) <= 63
