"""The serving entry point (`services/serving/entry.py`) in process: the API's bearer tokens give the tenant,
a tenant calls its own models by their name and another tenant's public ones by their qualified name
OWNER/NAME (another tenant's private model is unknown: 404), the repository index lists what the caller may
see under those names, `/metrics` counts per model, and a version this node does not hold goes through exactly
one hop to the node that holds it."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import numpy as np
import pytest

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.held import model_key
from gpuyard.services.serving.proxy import HOP_HEADER, Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.shared.auth.jobtokens import PREFIX as JOB_TOKEN_PREFIX
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.models import ExecutionProvider, ModelReady
from gpuyard.shared.stores.readmodels.modelregistry import ModelVersion, ModelView

from .models import Mlp

TOKENS = "tok-vision=vision:ana,tok-nlp=nlp:bo,tok-root=ops:root:admin"
V1, V2 = Mlp(seed=1), Mlp(seed=2)
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def view(tenant: str, name: str, public: bool = False) -> ModelView:
    now = datetime.now(UTC)
    version = ModelVersion(version=1, uri="x", sha256="0" * 64, size_bytes=1, published_at=now)
    return ModelView(
        name=name, tenant=tenant, public=public, versions=[version], created_at=now, updated_at=now
    )


class Catalog:
    def __init__(self, *views: ModelView):
        self.views = {(v.tenant, v.name): v for v in views}
        self.reads = 0

    async def get(self, tenant: str, name: str) -> ModelView | None:
        self.reads += 1
        return self.views.get((tenant, name))


def node(name: str, catalog: Catalog, client: httpx.AsyncClient | None = None):
    registry = ModelRegistry()
    routes = Routes(name)
    access = Access(Tokens(None, TOKENS), catalog, registry, routes)
    routes.on_model_change = access.forget
    forwarder = Forwarder(registry, routes, client)
    app = create_entry_app(registry, access, forwarder)
    return registry, routes, app


def ready(job: str, tenant: str, name: str, version: int, at: str) -> ModelReady:
    return ModelReady(
        name=name, tenant=tenant, version=version, job_id=job, node=at, endpoint=f"http://{at}:8000",
        provider=ExecutionProvider.CPU,
    )  # fmt: skip


def body(x: np.ndarray = X) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def single():
    catalog = Catalog(view("vision", "mnist"), view("nlp", "shared", public=True), view("nlp", "private"))
    registry, routes, app = node("node-a", catalog)
    registry.add(model_key("vision", "mnist"), 1, load_onnx(V1.bytes))
    registry.add(model_key("nlp", "shared"), 1, load_onnx(V2.bytes))
    registry.add(model_key("nlp", "private"), 1, load_onnx(V2.bytes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client:
        client.catalog = catalog
        yield client
    await registry.close()


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing bearer token"),
        (bearer("nope"), "unknown or revoked token"),
        (bearer(JOB_TOKEN_PREFIX + "abc"), "publish token"),
        ({"Authorization": "Basic dXNlcg=="}, "missing bearer token"),
    ],
)
async def test_no_valid_token_is_401_with_the_reason(single, headers, reason):
    answer = await single.post("/v2/models/mnist/infer", json=body(), headers=headers)
    assert answer.status_code == 401 and reason in answer.json()["error"]


async def test_a_tenant_calls_its_own_models_and_public_ones_and_nothing_else(single):
    own = await single.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-vision"))
    assert own.status_code == 200, own.text
    assert own.json()["model_name"] == "mnist" and own.json()["model_version"] == "1"
    np.testing.assert_allclose(np.array(own.json()["outputs"][0]["data"]).reshape(2, 3), V1(X), rtol=1e-5)
    public = await single.post("/v2/models/nlp/shared/infer", json=body(), headers=bearer("tok-vision"))
    assert public.status_code == 200 and public.json()["model_name"] == "nlp/shared"
    unqualified = await single.post("/v2/models/shared/infer", json=body(), headers=bearer("tok-vision"))
    assert unqualified.status_code == 404 and "OWNER/shared" in unqualified.json()["error"]
    for path in ("/v2/models/nlp/private/infer", "/v2/models/nlp/private", "/v2/models/nlp/private/ready"):
        hidden = await single.request(
            "POST" if path.endswith("infer") else "GET", path, json=body(), headers=bearer("tok-vision")
        )
        assert hidden.status_code == 404 and hidden.json() == {"error": "unknown model 'nlp/private'"}
    assert (
        await single.post("/v2/models/private/infer", json=body(), headers=bearer("tok-nlp"))
    ).status_code == 200
    assert (
        await single.post("/v2/models/nlp/private/infer", json=body(), headers=bearer("tok-nlp"))
    ).status_code == 200  # its own tenant qualified: the same model
    assert (
        await single.post("/v2/models/nlp/private/infer", json=body(), headers=bearer("tok-root"))
    ).status_code == 200  # an admin may use any, by its qualified name
    nothing = await single.get("/v2/models/nothing", headers=bearer("tok-vision"))
    assert nothing.status_code == 404


async def test_visibility_is_read_once_and_again_after_a_model_event(single):
    for _ in range(3):
        await single.post("/v2/models/nlp/shared/infer", json=body(), headers=bearer("tok-vision"))
    assert single.catalog.reads == 1


async def test_the_index_lists_what_the_caller_may_see_and_loads_belong_to_deployments(single):
    index = await single.post("/v2/repository/index", headers=bearer("tok-vision"))
    assert sorted(e["name"] for e in index.json()) == ["mnist", "nlp/shared"]
    load = await single.post("/v2/repository/models/mnist/unload", headers=bearer("tok-vision"))
    assert load.status_code == 403 and "gpuyard models undeploy" in load.json()["error"]


async def test_metrics_count_requests_and_latency_per_model(single):
    await single.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-vision"))
    await single.post("/v2/models/mnist/infer", json={"inputs": []}, headers=bearer("tok-vision"))
    text = (await single.get("/metrics")).text
    labels = 'tenant="vision",model="mnist",version="1"'
    assert f'gpuyard_inference_requests_total{{{labels},outcome="success"}} 1' in text
    assert f'gpuyard_inference_requests_total{{{labels},outcome="failure"}} 1' in text
    assert f'gpuyard_inference_request_seconds_bucket{{{labels},le="+Inf"}} 2' in text
    assert f"gpuyard_inference_request_seconds_count{{{labels}}} 2" in text


async def test_a_version_held_elsewhere_is_one_hop_away_and_never_two():
    catalog = Catalog(view("vision", "mnist"))
    b_registry, b_routes, b_app = node("node-b", catalog)
    b_registry.add(model_key("vision", "mnist"), 2, load_onnx(V2.bytes))
    to_b = httpx.AsyncClient(transport=httpx.ASGITransport(app=b_app))
    a_registry, a_routes, a_app = node("node-a", catalog, to_b)
    a_registry.add(model_key("vision", "mnist"), 1, load_onnx(V1.bytes))
    for routes in (a_routes, b_routes):
        routes.ready(ready("job-1", "vision", "mnist", 1, "node-a"))
        routes.ready(ready("job-2", "vision", "mnist", 2, "node-b"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a_app), base_url="http://a") as a:
        newest = await a.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-vision"))
        assert newest.status_code == 200 and newest.json()["model_version"] == "2"  # the newest ready: B's
        np.testing.assert_allclose(
            np.array(newest.json()["outputs"][0]["data"]).reshape(2, 3), V2(X), rtol=1e-5
        )
        local = await a.post("/v2/models/mnist/versions/1/infer", json=body(), headers=bearer("tok-vision"))
        assert local.json()["model_version"] == "1"
        # B answers a forwarded request for a version it does not hold itself: no second hop
        again = await to_b.post(
            "http://node-b:8000/v2/models/mnist/versions/1/infer",
            json=body(),
            headers={**bearer("tok-vision"), HOP_HEADER: "1"},
        )
        assert again.status_code == 404
        a_routes.gone("job-2")
        assert (await a.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-vision"))).json()[
            "model_version"
        ] == "1"
    await to_b.aclose()
    await a_registry.close()
    await b_registry.close()


async def test_a_node_that_does_not_answer_is_a_502_with_the_reason():
    catalog = Catalog(view("vision", "mnist"))

    def refuse(request):
        raise httpx.ConnectError("connection refused")

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    registry, routes, app = node("node-a", catalog, client)
    routes.ready(ready("job-2", "vision", "mnist", 2, "node-b"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as a:
        answer = await a.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-vision"))
    assert answer.status_code == 502 and "node node-b did not answer" in answer.json()["error"]
    await client.aclose()
