"""`POST /v1/nodes/{node}/cordon|drain|uncordon` (admins only) and what `GET /v1/nodes` then shows: each node's
state (ready, cordoned, draining, lost), each GPU's health and cordon; each change a `node.control` event in
the node's stream of the event store."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, GpuInfo, NodeHeartbeat
from gpuyard.shared.stores.readmodels import nodecontrol
from tests.unit.services.submit.submitctx import submit_context

TOKENS = {
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}
NLP = {"Authorization": "Bearer tok-nlp"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path, TOKENS) as c:
        yield c


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


GIB = 1 << 30


def heartbeat(ctx, node: str = "node-1", gpus: int = 2) -> None:
    hb = NodeHeartbeat(
        node=node,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", memory_bytes=80 * GIB) for i in range(gpus)],
        cpus=16,
        memory_bytes=64 * GIB,
    )
    ctx.telemetry.observe(make_event(hb, source="/executor"))


def shown(api, node: str = "node-1") -> dict:
    return next(n for n in api.get("/v1/nodes", headers=NLP).json() if n["node"] == node)


def test_a_tenant_may_not_cordon_drain_or_uncordon(api, ctx):
    heartbeat(ctx)
    for action in ("cordon", "drain", "uncordon"):
        answer = api.post(f"/v1/nodes/node-1/{action}", headers=NLP)
        assert answer.status_code == 403 and "admin" in answer.json()["detail"]
        assert api.post(f"/v1/nodes/node-1/{action}").status_code == 401
    assert asyncio.run(ctx.store.read_stream(nodecontrol.stream_id("node-1"))) == []


def test_cordon_then_uncordon_a_node(api, ctx):
    heartbeat(ctx)
    assert shown(api)["state"] == "ready"
    answer = api.post("/v1/nodes/node-1/cordon", json={"reason": "new fans"}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    assert answer.json()["cordoned"] and not answer.json()["draining"] and answer.json()["by"] == "root"
    node = shown(api)
    assert node["state"] == "cordoned" and node["reason"] == "new fans"
    assert all(g["cordoned"] and g["healthy"] for g in node["gpus"])
    assert api.post("/v1/nodes/node-1/uncordon", headers=ADMIN).json()["cordoned"] is False
    assert shown(api)["state"] == "ready"
    events = asyncio.run(ctx.store.read_stream(nodecontrol.stream_id("node-1")))
    assert [(e.event.type, e.event.data.action) for e in events] == [
        ("io.gpuyard.node.control", "cordon"),
        ("io.gpuyard.node.control", "uncordon"),
    ]


def test_drain_one_gpu_and_uncordon_it_clears_its_unhealthy_mark(api, ctx):
    heartbeat(ctx)
    mark = GpuHealthChanged(node="node-1", index=0, uuid="GPU-0", reason="lost", message="GPU lost")
    asyncio.run(nodecontrol.record(ctx.store, make_event(mark, source="/monitor")))
    drained = api.post("/v1/nodes/node-1/drain", json={"gpu": 1}, headers=ADMIN).json()
    assert drained["draining_gpus"] == [1] and drained["cordoned_gpus"] == [1] and not drained["cordoned"]
    assert drained["unhealthy_gpus"] == {"0": "GPU lost"}
    node = shown(api)
    assert node["state"] == "ready"
    [g0, g1] = node["gpus"]
    assert (g0["healthy"], g0["unhealthy_reason"], g0["cordoned"]) == (False, "GPU lost", False)
    assert (g1["healthy"], g1["cordoned"]) == (True, True)
    api.post("/v1/nodes/node-1/uncordon", json={"gpu": 0}, headers=ADMIN)
    api.post("/v1/nodes/node-1/uncordon", json={"gpu": 1}, headers=ADMIN)
    assert all(g["healthy"] and not g["cordoned"] for g in shown(api)["gpus"])


def test_a_drained_node_shows_draining(api, ctx):
    heartbeat(ctx)
    assert api.post("/v1/nodes/node-1/drain", headers=ADMIN).json()["draining"] is True
    assert shown(api)["state"] == "draining"


def test_an_unknown_node_or_gpu_is_a_404_and_a_bad_one_a_422(api, ctx):
    heartbeat(ctx)
    missing = api.post("/v1/nodes/node-9/cordon", headers=ADMIN)
    assert missing.status_code == 404 and "no node 'node-9'" in missing.json()["detail"]
    no_gpu = api.post("/v1/nodes/node-1/cordon", json={"gpu": 7}, headers=ADMIN)
    assert no_gpu.status_code == 404 and "has no GPU 7" in no_gpu.json()["detail"]
    assert api.post("/v1/nodes/node-1/cordon", json={"gpu": -1}, headers=ADMIN).status_code == 422
    assert api.post("/v1/nodes/node-1/cordon", json={"gpus": 1}, headers=ADMIN).status_code == 422
    assert api.post("/v1/nodes/.bad/cordon", headers=ADMIN).status_code == 422
