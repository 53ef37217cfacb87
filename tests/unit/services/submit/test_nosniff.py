"""A job's output is the job's own text: the API sends it as `text/plain; charset=utf-8` with
`X-Content-Type-Options: nosniff`, however it is asked for, so that no browser takes output that looks like a
page or a script for one."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from gpuyard.shared.stores.logs import LogKey, split
from tests.unit.services.submit.submitctx import submit_app, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
PAGE = b"<html><script>alert(document.cookie)</script></html>\n"


@pytest.fixture
def api(tmp_path):
    with submit_context(tmp_path) as ctx, TestClient(submit_app(ctx)) as client:
        client.ctx = ctx
        yield client


@pytest.fixture
def job(api):
    """A job that wrote a page as its output, then was cancelled (so that following it ends)."""
    job_id = api.post("/v1/jobs", json={"command": "cat page.html"}, headers=VISION).json()["job_id"]
    asyncio.run(api.ctx.logs.append(split(LogKey(job_id, 1, 0), 0, PAGE)))
    assert api.post(f"/v1/jobs/{job_id}/cancel", headers=VISION).status_code == 202
    return job_id


@pytest.mark.parametrize(
    ("params", "headers", "code"),
    [
        ({}, {}, 200),
        ({"tail": 1}, {}, 200),
        ({"follow": "true"}, {}, 200),
        ({"follow": "true", "tail": 1}, {}, 200),
        ({}, {"Range": "bytes=0-5"}, 206),
    ],
    ids=["whole", "tail", "follow", "follow-tail", "range"],
)
def test_a_jobs_output_is_never_sniffed(api, job, params, headers, code):
    answer = api.get(f"/v1/jobs/{job}/logs", params=params, headers={**VISION, **headers})
    assert answer.status_code == code
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert PAGE.startswith(answer.content)
