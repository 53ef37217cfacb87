"""The submit service's app in process, with a real embedded store, tokens and a session key."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from tests.unit.services.submit.submitctx import submit_context

TOKENS = {
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}
HOST = "testserver"


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path, TOKENS, session_secret=b"s" * 48, session_lifetime=3600) as c:
        yield c


@pytest.fixture
def client(ctx):
    with TestClient(create_app(ctx), base_url=f"http://{HOST}") as c:
        yield c


def login(client: TestClient, token: str, next_path: str = "/"):
    """Log in as the form does; the client keeps the cookie."""
    return client.post(
        "/login",
        data={"token": token, "next": next_path},
        headers={"Origin": f"http://{HOST}"},
        follow_redirects=False,
    )
