"""The dashboard's Models, Alerts and usage, and Tenants pages in a real browser: deploy a published
model from its page, see its replica go ready live, send one inference from the form (the browser calls the
serving entry point itself with the session cookie) and undeploy; an alert raised shows without a reload, and
only to whom it concerns; GPU-hours of a job that ran as bars, and their CSV; tenants' quotas, and an admin's
tokens: one created (shown once, and it works), then revoked (and it no longer does)."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import time

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from gpuyard.client import Client, ClientError  # noqa: E402
from gpuyard.shared.reporting.usage import CSV_COLUMNS  # noqa: E402
from tests.browser.conftest import raise_gpu_xid  # noqa: E402
from tests.unit.services.submit.onnxmodels import tiny_model  # noqa: E402

MODEL = "tiny-browser"
BURN = "end=$(($(date +%s)+6)); while [ $(date +%s) -lt $end ]; do :; done; echo burnt"


def top(page) -> None:
    """Back to the top before a full-page screenshot (the sticky header would show where it was scrolled)."""
    page.evaluate("window.scrollTo(0, 0)")


def accept_dialogs(page) -> None:
    page.on("dialog", lambda dialog: dialog.accept())


def test_deploy_a_model_see_it_ready_infer_from_the_form_and_undeploy(dashboard, yard):
    board = dashboard("vision")
    page = board.page
    accept_dialogs(page)
    board.api(
        "POST", "/v1/models", params={"name": MODEL}, content=tiny_model(3.0),
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    try:
        shown = page.goto(f"/models?model={MODEL}&tenant=vision")
        # the page may call the serving entry point: its Content-Security-Policy names it (connect-src)
        assert f"http://127.0.0.1:{yard.serving_port}" in connect_sources(shown, yard.serving_port)
        expect(page.locator(f"#models-table tr[data-model='{MODEL}']")).to_contain_text("not deployed")
        expect(page.locator("#model-name")).to_contain_text(MODEL)
        page.fill("#d-cpus", "0.1")
        page.fill("#d-memory", "256MB")
        page.click("#deploy")
        expect(page.locator("#model-message")).to_contain_text("serve job queued")
        ready = page.locator("#replicas-table tr[data-state='running'] .replica-status")
        expect(ready).to_have_text("ready", timeout=60_000)  # live: model.ready and job.started, no reload
        expect(page.locator(f"#models-table tr[data-model='{MODEL}']")).to_contain_text("v1 · 1/1 ready")
        # the serving address the page learned from model.ready, on this page's host
        expect(page.locator("#i-serving")).to_have_value(f"http://127.0.0.1:{yard.serving_port}")
        editor = page.locator("#i-body")
        expect(editor).to_have_value(prefilled("x", "FP32", [1, 3]))
        page.click("#infer-send")
        answer = page.locator("#infer-outputs tr[data-output='y'] td.data")
        expect(answer).to_have_text("[2.5, 2.8, 3.1]")  # y = 3x + 1 on the prefilled x = [0.5, 0.6, 0.7]
        expect(page.locator("#infer-result .ok")).to_contain_text(f"Answered by {MODEL} v1")
        rate = page.locator(f"#models-table tr[data-model='{MODEL}'] td.num").nth(2)
        expect(rate).to_contain_text("/s", timeout=15_000)  # from the serving entry point's /metrics
        top(page)
        board.screenshot("models")
        page.fill("#i-body", '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1]}]}')
        page.click("#infer-send")
        expect(page.locator("#infer-result .error")).to_contain_text("Refused (400)")
        page.click("#undeploy")
        expect(page.locator("#model-message")).to_contain_text("stopping")
        expect(page.locator("#model .empty")).to_contain_text("Not deployed.", timeout=30_000)
        expect(page.locator(f"#models-table tr[data-model='{MODEL}']")).to_contain_text("not deployed")
    finally:
        with contextlib.suppress(ClientError):  # (none live: the test undeployed it)
            board.api("DELETE", f"/v1/models/{MODEL}/deployments")


def connect_sources(response, port: int) -> set[str]:
    """The page's connect-src sources, with `scheme://host:*` spelled out for `port`."""
    policy = response.headers.get("content-security-policy", "")
    directive = next((d.split()[1:] for d in policy.split(";") if d.split()[:1] == ["connect-src"]), [])
    return {s.replace(":*", f":{port}") if s.endswith(":*") else s for s in directive}


def prefilled(name: str, datatype: str, shape: list[int]):
    """The editor's prefilled request starts with the model's first input, its -1 dimensions as 1."""
    return re.compile(
        r'^\{\s*"inputs": \[\s*\{\s*"name": "' + name + r'",\s*"datatype": "' + datatype + r'",\s*"shape": \[\s*'
        + r",\s*".join(map(str, shape)) + r"\s*\]",
    )  # fmt: skip


def wait_until_active(board, alert_id: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while alert_id not in {a["alert_id"] for a in board.api("GET", "/v1/alerts?state=active")["items"]}:
        assert time.monotonic() < deadline, f"{alert_id} was not raised in {timeout} s"
        time.sleep(0.2)


def test_an_alert_shows_live_to_admins_and_the_usage_chart_has_a_jobs_gpu_hours(dashboard, yard):
    vision = dashboard("vision")
    job = vision.api("POST", "/v1/jobs", json={"name": "burn", "command": BURN, "resources": {"gpus": 1}})
    admin = dashboard("admin")
    page = admin.page
    stream = "**/v1/events/stream*"
    page.route(stream, lambda route: route.abort())  # the page's event stream is down at first
    page.goto("/alerts")
    expect(page.locator("#alerts-active .empty, #alerts-active table")).to_be_visible()
    expect(page.locator("#live")).to_have_text("reconnecting…")
    page.evaluate("window.__stayed = true")
    missed = "node-unseen"
    raise_gpu_xid(yard, missed)  # while the stream is down: no alert.raised reaches the page
    wait_until_active(admin, f"gpu_xid/{missed}/0")
    page.unroute(stream)
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    row = page.locator(f"#alerts-active tr[data-alert='gpu_xid/{missed}/0']")
    expect(row).to_contain_text("critical")  # reloaded once the stream is back, not a minute later
    node = "node-ghost"
    raise_gpu_xid(yard, node)
    row = page.locator(f"#alerts-active tr[data-alert='gpu_xid/{node}/0']")
    expect(row).to_contain_text("critical", timeout=10_000)  # live, from alert.raised
    expect(row).to_contain_text(node)
    assert page.evaluate("window.__stayed") is True

    assert (
        yard.wait_state(job["job_id"], {"succeeded", "failed", "cancelled"}, timeout=60).state == "succeeded"
    )
    vision.page.goto("/alerts?since=24h")
    vpage = vision.page
    expect(vpage.locator(f"#alerts-active tr[data-alert='gpu_xid/{node}/0']")).to_have_count(
        0
    )  # a node's: admins'
    bar = vpage.locator("#usage-chart g.bar[data-key='vision'] rect.allocated")
    expect(bar).to_have_count(1, timeout=15_000)
    assert float(bar.get_attribute("width")) > 0
    expect(vpage.locator("#usage-chart g.bar")).to_have_count(1)  # a tenant sees its own only
    vpage.click(".seg button[data-value='user']")
    expect(vpage.locator("#usage-chart g.bar[data-key='ana (vision)']")).to_have_count(1)
    with vpage.expect_download() as download:
        vpage.click("#usage-csv")
    text = download.value.path().read_text()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == list(CSV_COLUMNS)  # gpuyard usage --csv's
    mine = [r for r in rows[1:] if r[:2] == ["vision", "ana"]]
    assert mine and float(mine[0][4]) > 0, rows
    top(vpage)
    vision.screenshot("usage")
    page.goto("/alerts")
    expect(page.locator(f"#alerts-active tr[data-alert='gpu_xid/{node}/0']")).to_have_count(1)
    top(page)
    admin.screenshot("alerts")


def test_tenants_and_quotas_and_an_admins_tokens(dashboard, yard):
    admin = dashboard("admin")
    page = admin.page
    accept_dialogs(page)
    vision = dashboard("vision")
    spec = {"name": "holds-a-gpu", "command": "sleep 600", "resources": {"gpus": 1}}
    held = vision.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        yard.wait_state(held, {"running"})
        page.goto("/tenants")
        head = page.locator("#tenants-table thead")
        for title in ("Guaranteed GPUs", "Used", "Borrowed", "Queued"):
            expect(head).to_contain_text(title)
        row = page.locator("#tenants-table tr[data-tenant='vision']")
        expect(row.locator("td.used")).to_have_text("1")  # its running job's GPU
    finally:
        vision.api("POST", f"/v1/jobs/{held}/cancel")

    page.fill("#t-tenant", "vision")
    page.fill("#t-user", "made-in-browser")
    page.click("#token-create")
    expect(page.locator("#token-once")).to_contain_text("shown this once")
    token = page.locator("#token-value").inner_text()
    made = Client(yard.server, token, timeout=30, retries=0)
    assert made.request("GET", "/v1/jobs")["items"] is not None  # it works
    row = page.locator("#tokens-table tr", has_text="made-in-browser")
    expect(row).to_have_count(1)
    token_id = row.get_attribute("data-token")
    top(page)
    admin.screenshot("tenants")
    page.reload()
    expect(page.locator("#tokens-table")).to_be_visible()
    expect(page.locator("#token-once")).to_have_count(0)  # shown once only
    assert token not in page.content()
    page.click(f"#tokens-table tr[data-token='{token_id}'] button.revoke")
    expect(page.locator("#token-message .ok")).to_contain_text("revoked")
    expect(page.locator(f"#tokens-table tr[data-token='{token_id}'] button.revoke")).to_have_count(0)
    with pytest.raises(ClientError, match="401|revoked|unknown"):
        made.request("GET", "/v1/jobs")

    vision.page.goto("/tenants")
    rows = vision.page.locator("#tenants-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-tenant", "vision")
    expect(vision.page.locator("#tokens")).to_have_count(0)  # no token management
    top(vision.page)
    vision.screenshot("tenants-tenant")
