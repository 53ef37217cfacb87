"""The dashboard's main flow in a real browser (issue 28): log in, submit from the form and watch the job run
without reloading, its logs, cancel, a bad spec's error in place, a waiting job's reason, tenants kept apart,
log out."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

WATCH_STATES = """() => {
  window.__states = [];
  window.__stayed = true;
  const seen = () => {
    const text = document.querySelector('#job-state')?.textContent;
    if (text && window.__states.at(-1) !== text) window.__states.push(text);
  };
  seen();
  new MutationObserver(seen).observe(document.getElementById('page'), {subtree: true, childList: true, characterData: true});
}"""


def sleeper(board, name: str, gpus: float = 1, seconds: int = 600) -> str:
    spec = {"name": name, "command": f"sleep {seconds}", "resources": {"gpus": gpus}}
    return board.api("POST", "/v1/jobs", json=spec)["job_id"]


def test_submit_from_the_form_and_watch_it_run_without_reloading(dashboard):
    board = dashboard("vision")
    page = board.page
    page.goto("/submit")
    page.fill("#name", "hello-browser")
    page.fill("#command", "echo hello from the browser; sleep 2")
    page.fill("#gpus", "1")
    expect(page.locator("#spec")).to_have_value(
        re.compile(r'command: "echo hello from the browser; sleep 2"')
    )
    expect(page.locator("#verdict")).to_contain_text("valid")
    board.screenshot("submit")
    page.click("#submit")
    page.wait_for_url(re.compile(r"/jobs/[0-9a-z-]+$"))
    page.evaluate(WATCH_STATES)
    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=30_000)
    states = page.evaluate("window.__states")
    assert states[0] in ("queued", "placed", "running") and states[-1] == "succeeded", states
    assert "running" in states, states
    assert page.evaluate("window.__stayed") is True  # the same document all along: no reload
    expect(page.locator("#log")).to_contain_text("hello from the browser")  # step 3: its logs
    expect(page.locator("#timeline li[data-kind='job.succeeded']")).to_have_count(1)
    board.screenshot("job")


def test_cancel_a_running_job(dashboard):
    board = dashboard("vision")
    job_id = sleeper(board, "to-cancel")
    page = board.page
    page.goto(f"/jobs/{job_id}")
    page.evaluate(WATCH_STATES)
    expect(page.locator("#job-state")).to_have_text("running", timeout=20_000)
    page.click("#cancel")
    expect(page.locator("#job-state")).to_have_text("cancelled", timeout=20_000)
    assert page.evaluate("window.__stayed") is True


def test_a_bad_spec_shows_the_apis_reason_in_place(dashboard):
    page = dashboard("vision").page
    page.goto("/submit")
    page.fill("#spec", "name: Bad_Name\ncommand: echo hi\nresources:\n  gpus: -1\n")
    verdict = page.locator("#verdict .error")
    expect(verdict).to_contain_text("name")
    expect(verdict).to_contain_text("gpus")
    page.click("#submit")
    expect(page.locator("#submit-result .error")).to_contain_text("gpus")
    assert "/submit" in page.url  # not submitted: still here
    page.fill("#spec", "name: [unclosed\n")
    expect(page.locator("#verdict .error")).to_contain_text("line")


def test_a_waiting_job_says_why_and_its_place_in_line(dashboard):
    board = dashboard("vision")
    big = sleeper(board, "fills-the-node", gpus=8)
    board.yard.wait_state(big, {"running"})
    waiting = sleeper(board, "waits-for-a-gpu", gpus=1)
    try:
        page = board.page
        page.goto("/jobs?state=queued")
        row = page.locator(f"tr[data-job='{waiting}']")
        expect(row).to_contain_text("in line", timeout=15_000)
        expect(row).to_contain_text("GPU")
        board.screenshot("jobs")
        page.click(f"tr[data-job='{waiting}'] a")
        expect(page.locator("#why-summary")).to_be_visible()
        expect(page.locator("#why")).to_contain_text("Queue position")
    finally:
        for job_id in (big, waiting):
            board.api("POST", f"/v1/jobs/{job_id}/cancel")


def test_a_tenant_never_sees_another_tenants_job(dashboard):
    theirs = sleeper(dashboard("nlp"), "nlp-private", gpus=0, seconds=1)
    board = dashboard("vision")
    page = board.page
    response = page.goto(f"/jobs/{theirs}")
    assert response.status == 404
    expect(page.locator("main")).to_contain_text("no job")
    page.goto("/jobs")
    expect(page.locator("#jobs-table, .empty")).to_be_visible()
    assert theirs not in page.content()
    page.fill("#f-q", theirs[:12])
    page.click("form.filters button[type=submit]")
    expect(page.locator(".empty")).to_contain_text("No job matches")
    admin = dashboard("admin").page
    admin.goto(f"/jobs/{theirs}")
    expect(admin.locator("#job-state")).to_be_visible()


def test_log_out(dashboard):
    page = dashboard("vision").page
    page.goto("/jobs")
    page.click("form.logout button")
    expect(page.locator("#token")).to_be_visible()
    page.goto("/jobs")
    expect(page.locator("#token")).to_be_visible()  # sent back to the login form
    assert "next=/jobs" in page.url
