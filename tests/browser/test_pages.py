"""Every page of the dashboard opens, draws itself from the API without a script error, and carries the same
navigation; a screenshot of each is kept (test-artifacts/screenshots/, git-ignored) to be looked at."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from services.submit.dashboard.pages import NAV, PAGES  # noqa: E402


def test_every_page_draws_itself_with_jobs_waiting_running_and_finished(dashboard):
    board = dashboard("admin")
    done = board.api(
        "POST", "/v1/jobs", json={"name": "finished", "command": "echo done", "resources": {"gpus": 0}}
    )
    running = board.api(
        "POST", "/v1/jobs", json={"name": "busy", "command": "sleep 600", "resources": {"gpus": 8}}
    )
    waiting = board.api(
        "POST", "/v1/jobs", json={"name": "waiting", "command": "sleep 1", "resources": {"gpus": 2}}
    )
    try:
        board.yard.wait_state(running["job_id"], {"running"})
        board.yard.wait_state(done["job_id"], {"succeeded"})
        page = board.page
        for entry in PAGES:
            path = entry.path.replace("{job_id}", waiting["job_id"])
            page.goto(path)
            expect(page.locator("header.top nav a")).to_have_text([p.nav for p in NAV])
            expect(page.locator("main section").first).to_be_visible()  # the script drew the page
            name = entry.script.removesuffix(".js")
            board.screenshot(f"all-{name}")
    finally:
        for job in (running, waiting):
            board.api("POST", f"/v1/jobs/{job['job_id']}/cancel")
