"""The submit service's app in process, with a real embedded store, tokens and a session key."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from services.submit.app import create_app
from services.submit.context import SubmitContext
from shared.ledger import JobLedger
from shared.logstore import open_log_store
from shared.store import open_store
from shared.tokens import Tokens

TOKENS = {
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}
HOST = "testserver"


@pytest.fixture
def ctx(tmp_path):
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": TOKENS}))
    context = SubmitContext(
        store=store,
        ledger=JobLedger(store, None, "/test"),
        tokens=Tokens(tokens_file),
        logs=asyncio.run(open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")),
        session_secret=b"s" * 48,
        session_lifetime=3600,
    )
    yield context
    asyncio.run(store.close())
    asyncio.run(context.logs.close())


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
