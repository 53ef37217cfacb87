"""`POST /v1/jobs/{id}/checkpoints`: a job reports the checkpoints it saves, with its own checkpoint token and
nothing else; the job's view says the latest one. And `gpuyard.checkpoint.save` inside a job reports to it."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from fastapi.testclient import TestClient

from gpuyard import checkpoint
from gpuyard.services.submit import routes_checkpoints
from gpuyard.services.submit.app import create_app
from gpuyard.shared.auth.jobtokens import CHECKPOINT_SCOPE, ensure_secret, read_secret, sign
from gpuyard.shared.contracts.events.jobs import (
    JobCheckpointed,
    JobPlaced,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from tests.unit.services.submit.submitctx import TOKENS, served, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
ADMIN = {"Authorization": "Bearer tok-admin"}
REPORT = {"step": 120, "size_bytes": 4096, "saved_at": "2026-11-01T12:00:00Z"}


@pytest.fixture
def ctx(tmp_path):
    ensure_secret(tmp_path / "publish.key")
    with submit_context(
        tmp_path, TOKENS, max_body_bytes=4096, publish_secret_file=tmp_path / "publish.key"
    ) as ctx:
        yield ctx


@pytest.fixture(autouse=True)
def reports_at_any_pace(monkeypatch):
    """The tests send reports back to back; the least time between two has a test of its own."""
    monkeypatch.setattr(routes_checkpoints, "MIN_REPORT_SECONDS", 0.0)


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def running_job(ctx, job_id: str = "0123456789abcdef", tenant: str = "vision") -> str:
    spec = JobSpec(command="true")
    for data in (
        JobSubmitted(job_id=job_id, name="train", tenant=tenant, user="ana", spec=spec),
        JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
        JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0]),
    ):
        asyncio.run(ctx.ledger.append(job_id, data))
    return job_id


def token(ctx, job_id: str, tenant: str = "vision", attempt: int = 1, scope: str = CHECKPOINT_SCOPE) -> dict:
    secret = read_secret(ctx.publish_secret_file)
    signed = sign(secret, tenant=tenant, job_id=job_id, attempt=attempt, lifetime=600, scope=scope)
    return {"Authorization": f"Bearer {signed}"}


def report(api, job_id: str, headers: dict, body: dict | None = None, expect: int = 201) -> dict:
    answer = api.post(
        f"/v1/jobs/{job_id}/checkpoints", json=REPORT if body is None else body, headers=headers
    )
    assert answer.status_code == expect, answer.text
    return answer.json()


def test_the_job_reports_its_checkpoints_and_its_view_says_the_latest(api, ctx):
    job_id = running_job(ctx)
    assert api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["checkpoint"] is None
    first = report(api, job_id, token(ctx, job_id))
    assert (first["job_id"], first["attempt"], first["step"], first["duplicate"]) == (job_id, 1, 120, False)
    assert report(api, job_id, token(ctx, job_id))["duplicate"]  # the same report again: recorded once
    report(api, job_id, token(ctx, job_id), {"step": 240, "size_bytes": 8192})  # (its time: the server's)
    latest = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["checkpoint"]
    assert (latest["step"], latest["size_bytes"], latest["attempt"]) == (240, 8192, 1)
    events = [e.data for e in asyncio.run(ctx.ledger.events(job_id)) if isinstance(e.data, JobCheckpointed)]
    assert [(e.step, e.size_bytes, e.attempt) for e in events] == [(120, 4096, 1), (240, 8192, 1)]
    assert events[0].saved_at.isoformat() == "2026-11-01T12:00:00+00:00"


def test_a_job_records_one_report_a_second_at_most(api, ctx, monkeypatch):
    monkeypatch.setattr(routes_checkpoints, "MIN_REPORT_SECONDS", 3600.0)  # (a second: a race with the clock)
    job_id = running_job(ctx)
    report(api, job_id, token(ctx, job_id))
    assert report(api, job_id, token(ctx, job_id))[
        "duplicate"
    ]  # the same report again: answered, recorded once
    answer = api.post(
        f"/v1/jobs/{job_id}/checkpoints", json={"step": 121, "size_bytes": 1}, headers=token(ctx, job_id)
    )
    assert answer.status_code == 429 and "not recorded" in answer.json()["detail"], answer.text
    assert 3500 < int(answer.headers["retry-after"]) <= 3600
    assert api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["checkpoint"]["step"] == 120


def test_only_the_jobs_own_checkpoint_token_may_report(api, ctx):
    mine = running_job(ctx)
    sibling = running_job(ctx, "fedcba9876543210")  # another job of the same tenant
    theirs = running_job(ctx, "abcdefabcdef0000", tenant="nlp")
    for headers in (VISION, ADMIN):  # a person's token, an admin's too: 403, whoever's job
        for job_id in (mine, theirs, "no-such-job"):
            assert "only the job itself" in report(api, job_id, headers, expect=403)["detail"]
    publish_token = token(ctx, mine, scope="models:publish")
    assert "publish token" in report(api, mine, publish_token, expect=403)["detail"]
    assert report(api, mine, token(ctx, sibling), expect=404)["detail"] == f"no job {mine!r}"
    assert report(api, mine, token(ctx, theirs, tenant="nlp"), expect=404)["detail"] == f"no job {mine!r}"
    assert report(api, theirs, token(ctx, mine), expect=404)["detail"] == f"no job {theirs!r}"
    forged = token(ctx, mine, tenant="nlp")  # (signed, but for a tenant the job is not of)
    report(api, mine, forged, expect=404)
    assert report(api, mine, {}, expect=401)["detail"].startswith("missing bearer token")
    assert report(api, mine, {"Authorization": "Bearer tok-unknown"}, expect=401)
    tampered = token(ctx, mine)["Authorization"][:-4] + "AAAA"
    assert "bad signature" in report(api, mine, {"Authorization": tampered}, expect=401)["detail"]
    for job_id in (mine, sibling, theirs):  # nothing recorded for any of them
        assert api.get(f"/v1/jobs/{job_id}", headers=ADMIN).json()["checkpoint"] is None


def test_the_token_is_void_once_its_attempt_ended(api, ctx):
    job_id = running_job(ctx)
    asyncio.run(
        ctx.ledger.append(job_id, JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.PREEMPTED))
    )
    refused = report(api, job_id, token(ctx, job_id), expect=409)["detail"]
    assert "is not running" in refused and "void" in refused
    assert report(api, job_id, token(ctx, job_id, attempt=2), expect=409)  # attempt 2 is queued, not running
    assert api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["checkpoint"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"step": -1, "size_bytes": 1},
        {"step": 1},
        {"step": "1", "size_bytes": 1},
        {"step": True, "size_bytes": 1},
        {"step": 1, "size_bytes": 2**63},
        {"step": 1.5, "size_bytes": 1},
        {"step": 1, "size_bytes": 1, "saved_at": 1700000000},
        {"step": 1, "size_bytes": 1, "saved_at": "2026-11-01T12:00:00"},  # (no time zone)
        {"step": 1, "size_bytes": 1, "extra": 1},
        [],
        "step",
    ],
)
def test_bad_input_is_a_422_with_its_reason(api, ctx, body):
    job_id = running_job(ctx)
    answer = api.post(f"/v1/jobs/{job_id}/checkpoints", json=body, headers=token(ctx, job_id))
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]


def test_a_body_that_is_not_json_or_too_large_is_refused_not_a_500(api, ctx):
    job_id = running_job(ctx)
    headers = {**token(ctx, job_id), "Content-Type": "application/json"}
    url = f"/v1/jobs/{job_id}/checkpoints"
    assert api.post(url, content=b"{not json", headers=headers).status_code in (400, 422)
    assert api.post(url, content=b"x" * 5000, headers=headers).status_code == 413


def test_a_checkpoint_token_opens_no_other_route(api, ctx):
    job_id = running_job(ctx)
    headers = token(ctx, job_id)
    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("GET", "/v1/jobs"),
    ):
        assert api.request(method, path, headers=headers).status_code == 401, path
    answer = api.post("/v1/models", params={"name": "m"}, content=b"onnx", headers=headers)
    assert answer.status_code == 401 and "jobs:checkpoint" in answer.json()["detail"]


# ---------------------------------------------------------------- gpuyard.checkpoint, inside a job


def test_a_save_inside_a_job_is_reported_with_the_jobs_token(ctx, tmp_path, monkeypatch):
    job_id = running_job(ctx)
    signed = token(ctx, job_id)["Authorization"].removeprefix("Bearer ")
    with served(create_app(ctx)) as server:
        for name, value in (
            ("GPUYARD_SERVER", server),
            ("GPUYARD_JOB_ID", job_id),
            ("GPUYARD_CHECKPOINT_TOKEN", signed),
            ("GPUYARD_CHECKPOINT_DIR", str(tmp_path / "ckpt")),
        ):
            monkeypatch.setenv(name, value)
        saved = checkpoint.save(b"x" * 1000, 7)
    with TestClient(create_app(ctx)) as api:
        latest = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["checkpoint"]
    assert (latest["step"], latest["size_bytes"], latest["attempt"]) == (7, 1000, 1)
    assert saved.parent == tmp_path / "ckpt"
    payload = json.loads(base64.urlsafe_b64decode(signed.split(".")[1] + "=="))
    assert payload["s"] == CHECKPOINT_SCOPE and payload["j"] == job_id
