"""History and accounting in `gpuyard up --simulate-gpus 2`: a busy job runs a few seconds; `gpuyard top --once`
shows its GPU busy with its job id, and `gpuyard usage --by job --json` then shows GPU-hours allocated and used
for it (its monitor wrote its node's samples to the GPU history)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

BUSY = [sys.executable, "-c", "while True: pass"]
BUSY_PCT = 10.0  # a busy loop reads about 100 % on a quiet machine; less on a loaded one


def test_a_busy_job_is_busy_in_top_and_has_gpu_hours_allocated_and_used(platform):
    client = platform.client()
    job = client.submit({"name": "busy", "command": BUSY, "resources": {"gpus": 1}}).job_id
    try:
        platform.wait_state(job, {"running"})

        def busy_in_nodes() -> bool:
            gpus = [g for n in client.nodes() for g in n.gpus if any(h.job_id == job for h in g.holders)]
            return bool(gpus) and (gpus[0].utilization_pct or 0) >= BUSY_PCT

        wait_for(busy_in_nodes, 60, 0.5, "GET /v1/nodes with the job's GPU busy")
        top = platform.cli("top", "--once")
        assert top.returncode == 0, top.stderr
        [row] = [line for line in top.stdout.splitlines() if job in line]
        assert float(re.search(r"(\d+)%", row).group(1)) >= BUSY_PCT, row

        def used_by_job():
            rows = client.usage(since="1h", by="job").rows
            return next((r for r in rows if r.job_id == job and r.used_gpu_hours > 0), None)

        wait_for(used_by_job, 60, 1.0, "the job's used GPU-hours from the GPU history")
    finally:
        client.cancel(job)
    platform.wait_state(job, {"cancelled"})
    usage = platform.cli("usage", "--since", "1h", "--by", "job", "--json")
    assert usage.returncode == 0, usage.stderr
    [mine] = [r for r in json.loads(usage.stdout)["rows"] if r["job_id"] == job]
    assert mine["allocated_gpu_hours"] > 0 and mine["used_gpu_hours"] > 0
    assert mine["used_gpu_hours"] <= mine["allocated_gpu_hours"] * 1.5  # (a sample or two past its end)
    assert mine["waste_gpu_hours"] == pytest.approx(
        max(0.0, mine["allocated_gpu_hours"] - mine["used_gpu_hours"]), abs=1e-5
    )
    described = platform.cli("describe", job)
    assert "mean utilization over its run" in described.stdout, described.stdout
