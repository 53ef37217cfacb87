"""A job's page shows the latest checkpoint the job reported (`gpuyard.checkpoint`, docs/storage.md), live: its
step, size and attempt under the job's name, and each report in its timeline; a preemption's line in the timeline
says the work it lost (since that checkpoint)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

SAVES = "import time\nfrom gpuyard import checkpoint\ncheckpoint.save(b'x' * 2048, 7)\ntime.sleep(600)\n"


def test_the_jobs_page_shows_its_latest_checkpoint_live(dashboard):
    board = dashboard("vision")
    spec = {"name": "saves", "command": ["python", "-c", SAVES], "resources": {"gpus": 0, "cpus": 0.1}}
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        page = board.page
        page.goto(f"/jobs/{job_id}")
        line = page.locator("#job-checkpoint")
        expect(line).to_contain_text("latest checkpoint: step 7 · 2 KiB · saved", timeout=30_000)
        expect(line).to_contain_text("by attempt 1")
        expect(page.locator('#timeline li[data-kind="job.checkpointed"]')).to_contain_text("step 7 · 2 KiB")
        board.screenshot("job-checkpoint")
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")


def test_a_preemption_in_the_timeline_says_the_work_it_lost(dashboard, yard):
    board = dashboard("vision")
    spec = {"name": "drained", "command": ["python", "-c", SAVES], "resources": {"gpus": 1, "cpus": 0.1}}
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    admin = yard.client()
    try:
        page = board.page
        page.goto(f"/jobs/{job_id}")
        expect(page.locator("#job-checkpoint")).to_contain_text("step 7", timeout=30_000)
        [placement] = board.api("GET", f"/v1/jobs/{job_id}")["placements"]
        node, gpu = placement["node"], {"gpu": placement["gpus"][0]["index"]}
        admin.request("POST", f"/v1/nodes/{node}/drain", json=gpu)
        try:
            preempted = page.locator('#timeline li[data-kind="job.preempted"]')
            expect(preempted).to_contain_text(
                re.compile(r"drain · node \S+ · lost .+ of work"), timeout=30_000
            )
            board.screenshot("job-preempted")
        finally:
            admin.request("POST", f"/v1/nodes/{node}/uncordon", json=gpu)
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")
