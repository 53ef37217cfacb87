"""An Idempotency-Key makes a retried POST /v1/jobs answer the job it queued the first time, on the fast path
and the route alike, after a restart of the service too (the key is the job's id in the event store); the same
key with another request is refused with a reason."""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi.testclient import TestClient

from gpuyard.shared.auth.tokens import Tokens
from tests.unit.services.submit.submitctx import submit_app, submit_context

TOKENS = Tokens(None, "tok-vision=vision:ana,tok-vision2=vision:bo,tok-nlp=nlp:cy")
SPEC = {"name": "train", "command": ["python", "train.py"], "resources": {"gpus": 1}}


def headers(token: str = "tok-vision", key: str | None = "key-1") -> dict:
    out = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return out | ({"Idempotency-Key": key} if key else {})


class Service(contextlib.ExitStack):
    """The submit app on an embedded store in `tmp_path`; a new Service on the same path is a restart."""

    def __init__(self, tmp_path, fast: bool = True):
        super().__init__()
        self.tmp_path, self.fast = tmp_path, fast

    def __enter__(self) -> TestClient:
        super().__enter__()
        ctx = self.enter_context(submit_context(self.tmp_path, TOKENS))
        return self.enter_context(TestClient(submit_app(ctx, self.fast)))


def post(client: TestClient, body=SPEC, **kw):
    return client.post("/v1/jobs", content=json.dumps(body), headers=headers(**kw))


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "route"])
def test_the_same_key_and_request_answer_the_same_job_once(tmp_path, fast):
    with Service(tmp_path, fast) as client:
        first, again = post(client), post(client)
        assert first.status_code == again.status_code == 202
        assert first.json()["job_id"] == again.json()["job_id"]
        assert not first.json()["duplicate"] and again.json()["duplicate"]
        jobs = client.get("/v1/jobs", headers=headers()).json()["items"]
        assert [j["job_id"] for j in jobs] == [first.json()["job_id"]]


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "route"])
@pytest.mark.parametrize(
    ("what", "body", "token"),
    [
        ("another command", {**SPEC, "command": ["python", "other.py"]}, "tok-vision"),
        ("another name", {**SPEC, "name": "other"}, "tok-vision"),
        ("more GPUs", {**SPEC, "resources": {"gpus": 2}}, "tok-vision"),
        ("another user of the tenant", SPEC, "tok-vision2"),
    ],
)
def test_the_same_key_with_another_request_is_409_with_a_reason(tmp_path, fast, what, body, token):
    with Service(tmp_path, fast) as client:
        job_id = post(client).json()["job_id"]
        refused = post(client, body, token=token)
        assert refused.status_code == 409, what
        detail = refused.json()["detail"]
        assert "Idempotency-Key 'key-1' was used for another request" in detail and job_id in detail
        assert len(client.get("/v1/jobs", headers=headers()).json()["items"]) == 1


def test_a_key_is_per_tenant(tmp_path):
    with Service(tmp_path) as client:
        vision, nlp = post(client), post(client, token="tok-nlp")
        assert vision.status_code == nlp.status_code == 202
        assert vision.json()["job_id"] != nlp.json()["job_id"] and not nlp.json()["duplicate"]


def test_the_key_outlives_a_restart_of_the_service(tmp_path):
    with Service(tmp_path) as client:
        first = post(client).json()
    with Service(tmp_path) as client:  # a new process: nothing but the store is kept
        again = post(client)
        assert again.status_code == 202 and again.json()["job_id"] == first["job_id"]
        assert again.json()["duplicate"]
        assert post(client, {**SPEC, "name": "other"}).status_code == 409


def test_without_a_key_each_request_is_a_new_job(tmp_path):
    with Service(tmp_path) as client:
        a, b = post(client, key=None).json(), post(client, key=None).json()
        assert a["job_id"] != b["job_id"]
