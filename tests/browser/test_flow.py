"""The dashboard's main flow in a real browser: log in, submit from the form and watch the job run
without reloading, its logs, cancel, a bad spec's error in place, a waiting job's reason, a running job's times
counting on while nothing happens to it, sizes written as the API writes them, tenants kept apart, log out."""

from __future__ import annotations

import re
import time

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


def sleeper(board, name: str, gpus: float = 1, seconds: int = 600, **resources) -> str:
    spec = {"name": name, "command": f"sleep {seconds}", "resources": {"gpus": gpus, **resources}}
    return board.api("POST", "/v1/jobs", json=spec)["job_id"]


def api_seconds(text: str) -> int:
    """The seconds of the API's "running on node-a for 1m05s" (shared/contracts/units.py, format_duration)."""
    found = re.search(r"\bfor ((?:\d+[dhms])+)", text)
    assert found, text
    return sum(
        int(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u]
        for n, u in re.findall(r"(\d+)([dhms])", found[1])
    )


def page_seconds(text: str) -> float:
    """The seconds of the page's "4.2 s", "1 min 5 s" (app.js, duration)."""
    parts = re.findall(r"([\d.]+) (d|h|min|s)\b", text)
    assert parts, text
    return sum(float(n) * {"d": 86400, "h": 3600, "min": 60, "s": 1}[u] for n, u in parts)


def ago_seconds(text: str) -> float:
    """The seconds of the page's "12 seconds ago", "now" (app.js, ago: Intl.RelativeTimeFormat in English)."""
    if text == "now":
        return 0
    found = re.fullmatch(r"(\d+) (second|minute|hour|day)s? ago", text)
    assert found, text
    return int(found[1]) * {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[found[2]]


def wait_until_it_advances(locator, seconds_of, timeout: float = 60) -> None:
    """Until the duration the element shows is more than it is now."""
    first = seconds_of(locator.inner_text())
    deadline = time.monotonic() + timeout
    while seconds_of(locator.inner_text()) <= first:
        assert time.monotonic() < deadline, f"{locator} still says {locator.inner_text()!r} after {timeout} s"
        locator.page.wait_for_timeout(200)


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
    expect(page.locator("#attempts tbody tr td:nth-child(6)")).to_have_text("succeeded")  # its outcome
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


def test_a_running_jobs_times_count_on_while_nothing_happens_to_it(dashboard):
    board = dashboard("vision")
    job_id = sleeper(board, "runs-quietly", gpus=0, cpus=0.1, memory="100MB")
    try:
        board.yard.wait_state(job_id, {"running"})
        page = board.page
        explained = []
        page.on("response", lambda r: r.url.endswith(f"/jobs/{job_id}/why") and explained.append(r.status))
        page.goto(f"/jobs/{job_id}")
        expect(page.locator("#live")).to_have_text("live")
        # read on opening, and again once its event stream opened: after that, only the clock moves
        deadline = time.monotonic() + 30
        while len(explained) < 2:
            assert time.monotonic() < deadline, f"the job's explanation was read {len(explained)} times"
            page.wait_for_timeout(100)
        summary = page.locator("#why-summary")
        expect(summary).to_contain_text(re.compile(r"running on \S+ for \d"))
        wait_until_it_advances(summary, api_seconds)
        ran = page.locator("#attempts tbody tr td:nth-child(4)")  # the attempt's "Ran"
        wait_until_it_advances(ran, page_seconds)
        submitted = page.locator("#job-head time").first  # "submitted 12 seconds ago"
        wait_until_it_advances(submitted, ago_seconds, timeout=150)  # (a minute's step, once past the first)
        expect(page.locator("#job-state")).to_have_text("running")
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")


def test_sizes_are_written_as_the_api_writes_them(dashboard):
    board = dashboard("vision")
    job_id = sleeper(board, "sized", gpus=0, cpus=0.1, memory="256MB")
    try:
        board.yard.wait_state(job_id, {"running"})
        page = board.page
        page.goto(f"/jobs/{job_id}")
        expect(page.locator("#why")).to_contain_text(
            "256 MB memory"
        )  # the API's words (shared/contracts/units.py)
        expect(page.locator("#placements tbody td").nth(4)).to_have_text("256 MB")  # the page's, alike
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")


def test_the_submit_page_shows_its_event_stream_live(dashboard):
    page = dashboard("vision").page
    page.goto("/submit")
    expect(page.locator("#verdict")).to_contain_text("valid")
    expect(page.locator("#live")).to_have_text("live")  # (it checks the spec again as nodes come and go)


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
