"""A name is its owner's, on the serving entry point in process (`access.py`, `v2app.py`): `/v2/models/mnist`
is the caller's own `mnist` and never another tenant's, even while the caller's own is being redeployed and
another tenant's public `mnist` is ready (then it is 503 with the reason); another tenant's public model is
reached by its qualified name `OWNER/NAME` only, on every route."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.held import Held, HeldSessions, model_key
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.models import ExecutionProvider, ModelReady
from gpuyard.shared.stores.readmodels.modelregistry import (
    ModelVersion,
    ModelView,
    qualified_name,
    split_qualified,
)

from .models import Mlp
from .server import serve

TOKENS = "tok-alpha=alpha:ana,tok-beta=beta:bo,tok-gamma=gamma:cy,tok-root=ops:root:admin"
MINE, THEIRS = Mlp(seed=1), Mlp(seed=2)
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
NODE = "node-a"


def view(tenant: str, name: str, public: bool = False) -> ModelView:
    now = datetime.now(UTC)
    version = ModelVersion(version=1, uri="x", sha256="0" * 64, size_bytes=1, published_at=now)
    return ModelView(
        name=name, tenant=tenant, public=public, versions=[version], created_at=now, updated_at=now
    )


class Catalog:
    def __init__(self, *views: ModelView):
        self.views = {(v.tenant, v.name): v for v in views}

    async def get(self, tenant: str, name: str) -> ModelView | None:
        return self.views.get((tenant, name))


def body() -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def ready(job: str, tenant: str) -> ModelReady:
    return ModelReady(
        name="mnist", tenant=tenant, version=1, job_id=job, node=NODE, endpoint=f"http://{NODE}:8000",
        provider=ExecutionProvider.CPU,
    )  # fmt: skip


def whose(answer: httpx.Response) -> str:
    """Whose model answered a 200: 'mine' (alpha's) or 'theirs' (beta's), told by the outputs."""
    y = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 3)
    if np.allclose(y, MINE(X), rtol=1e-5):
        return "mine"
    assert np.allclose(y, THEIRS(X), rtol=1e-5), y
    return "theirs"


class Yard:
    """One node: alpha's private `mnist` and beta's public `mnist` both deployed (held, routed)."""

    def __init__(self) -> None:
        self.registry = ModelRegistry()
        self.sessions = HeldSessions(self.registry)
        self.routes = Routes(NODE)
        catalog = Catalog(view("alpha", "mnist"), view("beta", "mnist", public=True))
        self.access = Access(Tokens(None, TOKENS), catalog, self.registry, self.routes)
        self.routes.on_model_change = self.access.forget
        self.app = create_entry_app(self.registry, self.access, Forwarder(self.registry, self.routes))
        self.mine, self.theirs = load_onnx(MINE.bytes), load_onnx(THEIRS.bytes)
        self.jobs = 0

    def deploy(self, tenant: str) -> Held:
        """A replica of `tenant`'s mnist taken on (loading: not in the registry yet)."""
        self.jobs += 1
        held = Held(job_id=f"job-{self.jobs}", attempt=1, tenant=tenant, name="mnist", version=1)
        assert self.sessions.begin(held)
        return held

    def loaded(self, held: Held) -> None:
        self.sessions.serve(held, self.mine if held.tenant == "alpha" else self.theirs)
        self.routes.ready(ready(held.job_id, held.tenant))

    async def undeploy(self, held: Held) -> None:
        await self.sessions.release(held)
        self.routes.gone(held.job_id)


@pytest.fixture
async def yard():
    yard = Yard()
    yard.alpha = yard.deploy("alpha")
    yard.loaded(yard.alpha)
    yard.loaded(yard.deploy("beta"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=yard.app), base_url="http://a") as c:
        yard.client = c
        yield yard
    await yard.sessions.close()


def test_a_qualified_name_is_owner_slash_name_and_splits_one_way():
    assert qualified_name("beta", "mnist") == "beta/mnist" == model_key("beta", "mnist")
    assert split_qualified("beta/mnist") == ("beta", "mnist")
    assert split_qualified("mnist") == (None, "mnist")


async def test_each_tenant_reaches_its_own_model_by_its_name_and_the_other_by_the_qualified_name(yard):
    c = yard.client
    own = await c.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-alpha"))
    assert own.status_code == 200 and whose(own) == "mine" and own.json()["model_name"] == "mnist"
    theirs = await c.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-beta"))
    assert whose(theirs) == "theirs"
    qualified = await c.post("/v2/models/beta/mnist/infer", json=body(), headers=bearer("tok-alpha"))
    assert qualified.status_code == 200 and whose(qualified) == "theirs"
    assert qualified.json()["model_name"] == "beta/mnist"
    versioned = await c.post(
        "/v2/models/beta/mnist/versions/1/infer", json=body(), headers=bearer("tok-alpha")
    )
    assert whose(versioned) == "theirs" and versioned.json()["model_version"] == "1"
    metadata = await c.get("/v2/models/beta/mnist", headers=bearer("tok-alpha"))
    assert metadata.json()["name"] == "beta/mnist" and metadata.json()["versions"] == ["1"]
    for path in ("/v2/models/beta/mnist/ready", "/v2/models/beta/mnist/versions/1/ready"):
        answer = await c.get(path, headers=bearer("tok-alpha"))
        assert answer.status_code == 200 and answer.json()["name"] == "beta/mnist", path
    # the caller's own tenant, qualified, is its own model
    self_named = await c.post("/v2/models/alpha/mnist/infer", json=body(), headers=bearer("tok-alpha"))
    assert whose(self_named) == "mine"
    # alpha's model is private: beta reaches it by no name
    hidden = await c.post("/v2/models/alpha/mnist/infer", json=body(), headers=bearer("tok-beta"))
    assert hidden.status_code == 404 and hidden.json() == {"error": "unknown model 'alpha/mnist'"}
    # an admin's name alone is its own tenant's; any tenant's model by its qualified name
    admin = await c.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-root"))
    assert admin.status_code == 404
    admin = await c.post("/v2/models/alpha/mnist/infer", json=body(), headers=bearer("tok-root"))
    assert whose(admin) == "mine"


async def test_a_tenant_with_no_model_of_that_name_never_gets_another_tenants(yard):
    c = yard.client
    answer = await c.post("/v2/models/mnist/infer", json=body(), headers=bearer("tok-gamma"))
    assert answer.status_code == 404
    assert "unknown model 'mnist'" in answer.json()["error"] and "OWNER/mnist" in answer.json()["error"]
    for path in ("/v2/models/mnist", "/v2/models/mnist/ready", "/v2/models/mnist/versions/1"):
        assert (await c.get(path, headers=bearer("tok-gamma"))).status_code == 404, path
    public = await c.post("/v2/models/beta/mnist/infer", json=body(), headers=bearer("tok-gamma"))
    assert whose(public) == "theirs"
    for bad in (
        "/v2/models/nobody/mnist/infer",
        "/v2/models/Beta/mnist/infer",
        "/v2/models/beta/MNIST/infer",
    ):
        refused = await c.post(bad, json=body(), headers=bearer("tok-gamma"))
        assert refused.status_code == 404 and "unknown model" in refused.json()["error"], bad


async def test_where_a_name_and_a_qualified_name_read_the_same_path_the_protocols_route_wins():
    """beta's public models named `ready` and `versions`: their metadata and readiness are asked with a version
    where the path without one is the protocol's own (the readiness, a version of alpha's `beta`)."""
    registry = ModelRegistry()
    routes = Routes(NODE)
    catalog = Catalog(view("beta", "ready", public=True), view("beta", "versions", public=True))
    app = create_entry_app(
        registry, Access(Tokens(None, TOKENS), catalog, registry, routes), Forwarder(registry, routes)
    )
    for name in ("ready", "versions"):
        registry.add(model_key("beta", name), 1, load_onnx(THEIRS.bytes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:

        async def get(path: str) -> httpx.Response:
            return await c.get(path, headers=bearer("tok-alpha"))

        assert (await get("/v2/models/beta/ready")).json()["error"].startswith("unknown model 'beta'")
        assert (await get("/v2/models/beta/ready/versions/1")).json()["name"] == "beta/ready"
        assert (await get("/v2/models/beta/ready/ready")).json()["name"] == "beta/ready"
        assert (await get("/v2/models/beta/versions")).json()["name"] == "beta/versions"
        assert (
            (await get("/v2/models/beta/versions/ready")).json()["error"].startswith("unknown model 'beta'")
        )
        assert (await get("/v2/models/beta/versions/versions/1/ready")).json()["name"] == "beta/versions"
        for name in ("ready", "versions"):
            answer = await c.post(f"/v2/models/beta/{name}/infer", json=body(), headers=bearer("tok-alpha"))
            assert whose(answer) == "theirs" and answer.json()["model_name"] == f"beta/{name}"
    await registry.close()


async def test_the_index_names_the_callers_models_by_name_and_the_others_by_qualified_name(yard):
    alpha = await yard.client.post("/v2/repository/index", headers=bearer("tok-alpha"))
    assert sorted(e["name"] for e in alpha.json()) == ["beta/mnist", "mnist"]
    gamma = await yard.client.post("/v2/repository/index", headers=bearer("tok-gamma"))
    assert [e["name"] for e in gamma.json()] == ["beta/mnist"]


async def test_while_the_callers_model_is_redeployed_it_is_answered_by_its_own_or_503_never_anothers(yard):
    """alpha keeps asking for `mnist` while its replica is released, is gone, loads again and is ready again;
    beta's public `mnist` is ready all along. Each phase waits until alpha's asker has been answered in it."""
    outcomes: list[tuple[str, str]] = []  # (phase it was asked in, 'mine' | 'theirs' | 'STATUS: error')
    phase = "ready"
    stop = asyncio.Event()
    answered = asyncio.Event()
    paths = ["/v2/models/mnist/infer", "/v2/models/mnist/versions/1/infer"]

    async def ask() -> None:
        turn = 0
        try:
            while not stop.is_set():
                asked_in, path = phase, paths[turn % len(paths)]
                turn += 1
                answer = await yard.client.post(path, json=body(), headers=bearer("tok-alpha"))
                if answer.status_code == 200:
                    outcomes.append((asked_in, whose(answer)))
                else:
                    outcomes.append((asked_in, f"{answer.status_code}: {answer.json()['error']}"))
                ready_answer = await yard.client.get("/v2/models/mnist/ready", headers=bearer("tok-alpha"))
                assert ready_answer.status_code in (200, 503), ready_answer.text
                answered.set()
                await asyncio.sleep(0)  # (a refusal never suspends: let the redeploy go on)
        finally:
            answered.set()  # (a failed asker wakes the test, which raises its error)

    async def answered_in(now: str, count: int = 6) -> None:
        nonlocal phase
        phase = now
        while sum(1 for p, _ in outcomes if p == now) < count:
            if asker.done():
                asker.result()
                raise AssertionError("the asker stopped")
            answered.clear()
            await answered.wait()

    asker = asyncio.create_task(ask())
    try:
        await answered_in("ready")
        released = asyncio.create_task(yard.undeploy(yard.alpha))  # queued requests answered first
        await answered_in("releasing")
        await released
        await answered_in("gone")
        again = yard.deploy("alpha")
        await answered_in("loading")
        yard.loaded(again)
        await answered_in("ready again")
    finally:
        stop.set()
        await asker
    assert all(what != "theirs" for _, what in outcomes), outcomes
    for p, what in outcomes:
        assert what == "mine" or what.startswith("503: model 'mnist'"), (p, what)
    gone = [what for p, what in outcomes if p in ("gone", "loading")]
    assert gone and all(what.startswith("503") and "no ready replica" in what for what in gone), gone
    assert [what for p, what in outcomes if p == "ready again"][-1] == "mine"
    # and beta's stays reachable by its qualified name all along
    qualified = await yard.client.post(
        "/v2/models/beta/mnist/infer", json=body(), headers=bearer("tok-alpha")
    )
    assert whose(qualified) == "theirs"


async def test_a_qualified_public_model_deployed_nowhere_is_503_and_a_private_one_404():
    registry = ModelRegistry()
    routes = Routes(NODE)
    catalog = Catalog(view("beta", "mnist", public=True), view("beta", "secret"))
    access = Access(Tokens(None, TOKENS), catalog, registry, routes)
    app = create_entry_app(registry, access, Forwarder(registry, routes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        idle = await c.post("/v2/models/beta/mnist/infer", json=body(), headers=bearer("tok-alpha"))
        assert idle.status_code == 503 and "model 'beta/mnist' has no ready replica" in idle.json()["error"]
        secret = await c.post("/v2/models/beta/secret/infer", json=body(), headers=bearer("tok-alpha"))
        assert secret.status_code == 404 and secret.json() == {"error": "unknown model 'beta/secret'"}


def test_tritonclient_names_another_tenants_model_owner_slash_name():
    """tritonclient puts the model's name in the path as it is (the slash kept): `infer("beta/mnist")`; a
    browser's `encodeURIComponent("beta/mnist")` (`beta%2Fmnist`) reaches the same model."""
    yard = Yard()
    yard.loaded(yard.deploy("beta"))
    with serve(yard.app) as running:
        client = triton.InferenceServerClient(running.url)
        try:
            given = triton.InferInput("x", [2, 4], "FP32")
            given.set_data_from_numpy(X)
            answer = client.infer("beta/mnist", [given], headers=bearer("tok-alpha"))
            np.testing.assert_allclose(answer.as_numpy("y"), THEIRS(X), rtol=1e-5)
            assert answer.get_response()["model_name"] == "beta/mnist"
            assert client.is_model_ready("beta/mnist", headers=bearer("tok-alpha"))
            assert (
                client.get_model_metadata("beta/mnist", headers=bearer("tok-alpha"))["name"] == "beta/mnist"
            )
            assert not client.is_model_ready("mnist", headers=bearer("tok-alpha"))
            # the slash percent-encoded (a browser's encodeURIComponent) is the same name
            encoded = httpx.post(
                f"{running.base}/v2/models/beta%2Fmnist/infer", json=body(), headers=bearer("tok-alpha")
            )
            assert encoded.status_code == 200 and encoded.json()["model_name"] == "beta/mnist"
        finally:
            client.close()
            running.call(yard.sessions.close())
