"""The fast path of `POST /v1/jobs` answers exactly as the FastAPI route does, and leaves every request it
cannot take as it is to the route (which explains what is wrong)."""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.fastpath import FastSubmit
from gpuyard.shared.auth.tokens import Tokens
from tests.unit.services.submit.submitctx import submit_app, submit_context

TOKENS = Tokens(None, "tok-vision=vision:ana,tok-admin=ops:root:admin")
SPEC = {"name": "train", "command": ["python", "train.py"], "resources": {"gpus": 0.5}}
JSON = "application/json"

# (what the request is, its headers, its body, whether the fast path takes it)
REQUESTS = [
    ("a valid spec", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, SPEC, True),
    ("json with a charset", {"Authorization": "bearer tok-vision", "Content-Type": JSON + "; charset=utf-8"}, SPEC, True),
    ("an admin for another tenant", {"Authorization": "Bearer tok-admin", "Content-Type": JSON}, {**SPEC, "tenant": "nlp"}, True),
    ("an idempotency key", {"Authorization": "Bearer tok-vision", "Content-Type": JSON, "Idempotency-Key": "k1"}, SPEC, True),
    ("the same key again", {"Authorization": "Bearer tok-vision", "Content-Type": JSON, "Idempotency-Key": "k1"}, SPEC, True),
    ("the same key, another spec", {"Authorization": "Bearer tok-vision", "Content-Type": JSON, "Idempotency-Key": "k1"}, {**SPEC, "command": "other"}, False),
    ("the scheme in capitals, spaces between", {"Authorization": "BEARER   tok-vision", "Content-Type": JSON}, SPEC, True),
    ("no token", {"Content-Type": JSON}, SPEC, False),
    ("an empty token", {"Authorization": "Bearer ", "Content-Type": JSON}, SPEC, False),
    ("two words after the scheme", {"Authorization": "Bearer tok-vision x", "Content-Type": JSON}, SPEC, False),
    ("an unknown token", {"Authorization": "Bearer nope", "Content-Type": JSON}, SPEC, False),
    ("basic auth", {"Authorization": "Basic tok-vision", "Content-Type": JSON}, SPEC, False),
    ("another tenant", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, {**SPEC, "tenant": "nlp"}, False),
    ("an invalid spec", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, {**SPEC, "resources": {"gpus": 1.5}}, False),
    ("an unknown field", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, {**SPEC, "gpu": 1}, False),
    ("not json", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b"{not json", False),
    ("a list", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, [SPEC], False),
    ("too deeply nested", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b"[" * 2000 + b"]" * 2000, False),
    ("a NUL byte in the env", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, {**SPEC, "env": {"X": "a\0b"}}, False),
    ("a NUL byte in the command", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, {**SPEC, "command": ["a\0b"]}, False),
    ("NaN gpus", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b'{"command": "x", "resources": {"gpus": NaN}}', False),
    ("Infinity cpus", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b'{"command": "x", "resources": {"cpus": Infinity}}', False),
    ("1e400 memory", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b'{"command": "x", "resources": {"memory": 1e400}}', False),
    ("-Infinity timeout", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b'{"command": "x", "timeout": -Infinity}', False),
    ("a lone surrogate", {"Authorization": "Bearer tok-vision", "Content-Type": JSON}, b'{"command": "\\ud800"}', False),
    ("text", {"Authorization": "Bearer tok-vision", "Content-Type": "text/plain"}, SPEC, False),
    ("a key over its limit", {"Authorization": "Bearer tok-vision", "Content-Type": JSON, "Idempotency-Key": "k" * 201}, SPEC, False),
]  # fmt: skip


@contextlib.contextmanager
def build(tmp_path, fast: bool):
    with submit_context(tmp_path, TOKENS, max_body_bytes=65536) as ctx:
        yield submit_app(ctx, fast)


@pytest.fixture
def taken(monkeypatch):
    """What the fast path answered for each request it saw (None: left to the app)."""
    answers: list[bytes | None] = []
    real = FastSubmit.accept

    async def accept(self, headers, body):
        answer = await real(self, headers, body)
        answers.append(answer)
        return answer

    monkeypatch.setattr(FastSubmit, "accept", accept)
    return answers


REFUSED_BEFORE_THE_BODY = {
    "no token",
    "an empty token",
    "two words after the scheme",
    "an unknown token",
    "basic auth",
}
"""Answered 401 before their body is read (`gpuyard.services.submit.app.BodyLimit`): the fast path never sees them."""


def send(client: TestClient, headers: dict, body):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/v1/jobs", content=content, headers=headers)
    answer = response.json()
    if isinstance(answer, dict):
        answer.pop("job_id", None)  # made up per job (the same with an Idempotency-Key, but per store)
    return response.status_code, response.headers.get("content-type"), answer


def test_the_fast_path_answers_as_the_route_and_leaves_the_rest_to_it(tmp_path, taken):
    with (
        build(tmp_path / "fast", fast=True) as fast_app,
        build(tmp_path / "route", fast=False) as route_app,
        TestClient(fast_app) as fast,
        TestClient(route_app) as route,
    ):
        for what, headers, body, takes in REQUESTS:
            seen = len(taken)
            assert send(fast, headers, body) == send(route, headers, body), what
            if what in REFUSED_BEFORE_THE_BODY:  # 401 from the app's BodyLimit, before any body is read
                assert len(taken) == seen, what
                continue
            assert len(taken) == seen + 1 and (taken[-1] is not None) == takes, what  # (route: no fast path)
        jobs = [fast.get("/v1/jobs", headers={"Authorization": "Bearer tok-admin"}).json()["items"]]
        jobs.append(route.get("/v1/jobs", headers={"Authorization": "Bearer tok-admin"}).json()["items"])
        # the same jobs were queued (one per accepted request, the repeated key once), with the same content
        assert [(j["tenant"], j["user"], j["spec"]) for j in jobs[0]] == [
            (j["tenant"], j["user"], j["spec"]) for j in jobs[1]
        ]
        assert len(jobs[0]) == 5


def test_other_routes_and_methods_pass_through(tmp_path, taken):
    with build(tmp_path, fast=True) as app:
        with TestClient(app) as client:
            assert client.get("/v1/jobs", headers={"Authorization": "Bearer tok-vision"}).status_code == 200
            assert (
                client.post("/v1/jobs/x/cancel", headers={"Authorization": "Bearer tok-vision"}).status_code
                == 404
            )
            assert client.get("/healthz").json()["status"] == "ok"
        assert taken == []
