"""The serving entry point accepts the dashboard's session cookie (its inference form calls it from the browser):
the submit service's key and tokens, CSRF on a POST, the dashboard's origins only (CORS preflight and answers),
a revoked token's session refused, and a bearer token still wins when both come."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.held import model_key
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.plan import plan

from .models import Mlp
from .test_entry import Catalog, body, view

DASHBOARD = "http://127.0.0.1:8080"
SECRET = b"k" * 48
MODEL = Mlp(seed=1)


class Yard:
    """One entry point over a tokens file, with a session for the tenant vision's token."""

    def __init__(self, client: httpx.AsyncClient, tokens: Tokens, token_id: str, token: str):
        self.client = client
        self.tokens = tokens
        self.token_id = token_id
        self.token = token
        self.cookie, self.session = sessions.issue(SECRET, token_id, 3600)
        self.csrf = sessions.csrf_token(SECRET, self.session)

    async def infer(
        self, *, csrf: str | None = "ok", origin: str | None = DASHBOARD, cookie: str | None = None
    ):
        headers = {}
        if csrf is not None:
            headers[sessions.CSRF_HEADER] = self.csrf if csrf == "ok" else csrf
        if origin is not None:
            headers["Origin"] = origin
        self.client.cookies.set(sessions.COOKIE, cookie or self.cookie)
        return await self.client.post("/v2/models/mnist/infer", json=body(), headers=headers)


@pytest.fixture
async def yard(tmp_path):
    tokens = Tokens(tmp_path / "tokens.yaml")
    token, entry = tokens.create(tenant="vision", user="ana")
    registry = ModelRegistry()
    registry.add(model_key("vision", "mnist"), 1, load_onnx(MODEL.bytes))
    access = Access(
        tokens,
        Catalog(view("vision", "mnist")),
        registry,
        Routes("node-a"),
        session_secret=SECRET,
        dashboard_origins=[DASHBOARD],
    )
    app = create_entry_app(
        registry, access, Forwarder(registry, Routes("node-a")), dashboard_origins=[DASHBOARD]
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000"
    ) as c:
        yield Yard(c, tokens, entry.id, token)
    await registry.close()


async def test_the_dashboards_session_infers_with_its_csrf_token_and_the_answer_is_readable_there(yard):
    answer = await yard.infer()
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json()["outputs"][0]["data"]).reshape(2, 3)
    np.testing.assert_allclose(got, MODEL(np.arange(8, dtype=np.float32).reshape(2, 4) / 8), rtol=1e-5)
    assert answer.headers["access-control-allow-origin"] == DASHBOARD
    assert answer.headers["access-control-allow-credentials"] == "true"


async def test_a_get_with_the_session_needs_no_csrf_token(yard):
    yard.client.cookies.set(sessions.COOKIE, yard.cookie)
    answer = await yard.client.get("/v2/models/mnist", headers={"Origin": DASHBOARD})
    assert answer.status_code == 200 and answer.json()["inputs"][0]["name"] == "x"


async def test_the_preflight_is_answered_for_the_dashboards_origin_only(yard):
    asked = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-csrf-token",
    }
    ok = await yard.client.options("/v2/models/mnist/infer", headers={"Origin": DASHBOARD, **asked})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == DASHBOARD
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert "x-csrf-token" in ok.headers["access-control-allow-headers"].lower()
    other = await yard.client.options(
        "/v2/models/mnist/infer", headers={"Origin": "http://evil.test", **asked}
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(
    ("change", "status", "reason"),
    [
        ({"csrf": None}, 403, "CSRF"),
        ({"csrf": "forged"}, 403, "CSRF"),
        ({"origin": "http://evil.test"}, 403, "not the dashboard's"),
        ({"cookie": "gys1.x.1.n.sig"}, 401, "session"),
    ],
)
async def test_a_session_request_without_its_csrf_token_from_another_origin_or_forged_is_refused(
    yard, change, status, reason
):
    answer = await yard.infer(**change)
    assert answer.status_code == status and reason in answer.json()["error"], answer.text


async def test_another_origins_page_cannot_read_an_answer(yard):
    yard.client.cookies.set(sessions.COOKIE, yard.cookie)
    answer = await yard.client.get("/v2/models/mnist", headers={"Origin": "http://evil.test"})
    assert "access-control-allow-origin" not in answer.headers


async def test_revoking_the_token_ends_its_sessions_here_too(yard):
    assert (await yard.infer()).status_code == 200
    yard.tokens.revoke(yard.token_id)
    refused = await yard.infer()
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]


async def test_a_session_signed_by_another_key_is_refused(yard):
    cookie, _ = sessions.issue(b"other" * 10, yard.token_id, 3600)
    refused = await yard.infer(cookie=cookie)
    assert refused.status_code == 401 and "another key" in refused.json()["error"]


async def test_a_bearer_token_is_read_first_and_needs_no_csrf(yard):
    yard.client.cookies.set(sessions.COOKIE, "not a session at all")
    answer = await yard.client.post(
        "/v2/models/mnist/infer", json=body(), headers={"Authorization": f"Bearer {yard.token}"}
    )
    assert answer.status_code == 200, answer.text


async def test_without_the_key_no_session_is_accepted(tmp_path):
    tokens = Tokens(tmp_path / "tokens.yaml")
    _, entry = tokens.create(tenant="vision", user="ana")
    registry = ModelRegistry()
    access = Access(tokens, Catalog(), registry, Routes("node-a"))
    app = create_entry_app(registry, access, Forwarder(registry, Routes("node-a")))
    cookie, session = sessions.issue(SECRET, entry.id, 3600)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client:
        client.cookies.set(sessions.COOKIE, cookie)
        answer = await client.post(
            "/v2/models/mnist/infer",
            json=body(),
            headers={sessions.CSRF_HEADER: sessions.csrf_token(SECRET, session)},
        )
    assert answer.status_code == 401 and "missing bearer token" in answer.json()["error"]


def test_gpuyard_up_gives_the_serving_service_its_dashboards_origins(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUYARD_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("GPUYARD_DASHBOARD_ORIGINS", raising=False)
    given = {"submit_port": "9090"}
    serving = plan(UpOptions(given=given), dict(os.environ)).settings["serving"]
    assert serving.dashboard_origin_list == {"http://127.0.0.1:9090", "http://localhost:9090"}
    monkeypatch.setenv("GPUYARD_DASHBOARD_ORIGINS", "https://yard.example")
    chosen = plan(UpOptions(given=given), dict(os.environ)).settings["serving"]
    assert chosen.dashboard_origin_list == {"https://yard.example"}
