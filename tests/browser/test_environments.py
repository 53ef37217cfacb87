"""The Environments page in a real browser: a job's own environment (`environment: {python: "3.11"}`: a clean
venv, nothing to download) appears with its node, Python and size once the node's heartbeat announces it, and
each node's Python versions; a tenant sees no Remove button, an admin removes it (the page says the removal was
sent), and neither page writes an error or a warning to the console."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from gpuyard.services.executor.environments.pythons import default_python, find_pythons  # noqa: E402

PYTHON = default_python(find_pythons("/usr/local/bin:/usr/bin"))
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no system python3.N")


def test_a_job_s_environment_is_listed_and_an_admin_removes_it(dashboard):
    tenant = dashboard("vision")
    spec = {
        "name": "own-env",
        "command": "true",
        "resources": {"cpus": 0.1, "memory": "100MB"},
        "environment": {"python": PYTHON},
    }
    job_id = tenant.api("POST", "/v1/jobs", json=spec)["job_id"]
    page = tenant.page
    page.goto("/environments")
    row = page.locator("#environments tr.environment")
    expect(row.first).to_be_visible(timeout=60_000)  # (built, then announced by the node's next heartbeat)
    expect(row.first).to_contain_text(PYTHON)
    expect(page.locator("#pythons tr.node-pythons").first).to_contain_text(PYTHON)
    expect(page.locator("#environments button[data-key]")).to_have_count(0)  # (a tenant removes none)
    key = row.first.locator("code.env-key").inner_text()
    assert tenant.api("GET", f"/v1/jobs/{job_id}")["state"] in ("succeeded", "running", "placed")

    admin = dashboard("admin")
    admin.page.goto("/environments")
    admin.page.on("dialog", lambda dialog: dialog.accept())
    button = admin.page.locator(f"#environments button[data-key='{key}']")
    expect(button.first).to_be_enabled(timeout=30_000)
    button.first.click()
    expect(admin.page.locator("#environment-action-result")).to_contain_text(f"Removal of {key} sent to")
    for board in (tenant, admin):
        board.page.goto("about:blank")
        assert board.console == [], "\n".join(board.console)
