"""A running job's page has a terminal (xterm.js, served by the dashboard itself): a shell in the job's replica,
in its working directory and environment, that takes what is typed and shows what the shell writes, says how it
ended, and closes with the job; another tenant's user never gets one. No console errors or warnings."""

from __future__ import annotations

import contextlib

import pytest

from gpuyard.client import ClientError

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402


def test_a_running_jobs_page_opens_a_terminal_in_the_job(dashboard):
    board = dashboard("vision")
    spec = {"name": "with-terminal", "command": "sleep 600", "resources": {"gpus": 0, "cpus": 0.1}}
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        page = board.page
        page.goto(f"/jobs/{job_id}")
        page.click("#terminal-open", timeout=30_000)  # (shown once the job runs)
        rows = page.locator("#terminal .xterm-rows")
        page.locator("#terminal").click()
        page.keyboard.type("echo answer-$((6*7)) $GPUYARD_JOB_ID\n")
        expect(rows).to_contain_text(f"answer-42 {job_id}", timeout=15_000)
        board.screenshot("job-terminal")
        page.keyboard.type("exit 3\n")
        expect(page.locator("#terminal-status")).to_have_text("The shell exited with code 3.", timeout=15_000)
        page.click("#terminal-close")
        page.click("#terminal-open")
        page.locator("#terminal").click()
        page.keyboard.type("echo again-$((1+1))\n")
        expect(page.locator("#terminal .xterm-rows")).to_contain_text("again-2", timeout=15_000)
        board.api("POST", f"/v1/jobs/{job_id}/cancel")
        expect(page.locator("#terminal-ended")).to_contain_text("its terminal has closed", timeout=30_000)
    finally:
        with contextlib.suppress(ClientError):  # (cancelled above already)
            board.api("POST", f"/v1/jobs/{job_id}/cancel")
    page.goto("about:blank")
    assert board.console == [], "\n".join(board.console)


def test_another_tenants_job_has_no_terminal_for_them(dashboard):
    owner, other = dashboard("vision"), dashboard("nlp")
    spec = {"name": "not-theirs", "command": "sleep 600", "resources": {"gpus": 0, "cpus": 0.1}}
    job_id = owner.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        owner.page.goto(f"/jobs/{job_id}")
        expect(owner.page.locator("#terminal-open")).to_be_visible(timeout=30_000)
        refused = other.page.evaluate(
            """(jobId) => new Promise((done) => {
                const ws = new WebSocket(`ws://${location.host}/v1/jobs/${jobId}/exec?tty=1`);
                ws.onopen = () => done("opened");
                ws.onerror = () => done("refused");
            })""",
            job_id,
        )
        assert refused == "refused"
    finally:
        owner.api("POST", f"/v1/jobs/{job_id}/cancel")
    other.page.goto("about:blank")
    other.console.clear()  # (Chromium says the refused upgrade on the console: that refusal is the test)
