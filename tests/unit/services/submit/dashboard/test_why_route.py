"""`GET /v1/jobs/{id}/why`: the dashboard's job page says what `gpuyard why` says (shared/reporting/why.py)."""

from __future__ import annotations

import asyncio

from gpuyard.shared.contracts.api.jobs import JobOut
from gpuyard.shared.contracts.events.jobs import JobPending, PendingReason
from gpuyard.shared.reporting import why

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}


def test_a_waiting_jobs_why_is_the_clis_explanation_and_only_for_its_tenant(client, ctx):
    job_id = client.post(
        "/v1/jobs", json={"name": "train", "command": "python t.py", "resources": {"gpus": 2}}, headers=VISION
    ).json()["job_id"]
    reason = PendingReason(code="insufficient_gpus", message="needs 2 GPUs on one node", position=3)
    asyncio.run(ctx.ledger.record(job_id, lambda view: JobPending(job_id=job_id, attempt=1, reason=reason)))
    answer = client.get(f"/v1/jobs/{job_id}/why", headers=VISION)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    rows = dict(body["rows"])
    assert "needs 2 GPUs on one node" in rows["Reason"] and rows["Queue position"].startswith("#3")
    job = JobOut.model_validate(client.get(f"/v1/jobs/{job_id}", headers=VISION).json())
    summary, expected_rows = why.explain(job)
    assert body["summary"] == summary and [label for label, _ in expected_rows] == list(rows)
    assert client.get(f"/v1/jobs/{job_id}/why", headers=NLP).status_code == 404
