"""Every page of the dashboard with data on it (jobs waiting, running, finished with outputs and failed, a deployed
model, a volume with files, an alert, tenants and their tokens, a node): it draws itself from the API with the same navigation and its event
stream live, writes no error and no warning to the console (nor a `quoted` word with its backticks), and fits a phone's width (390 px) as well as a desktop's (1400 px) without
the page itself scrolling sideways (a wide table scrolls inside its own box). A screenshot of each page at each
width is kept (test-artifacts/screenshots/, git-ignored) to be looked at."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from gpuyard.client import Client, ClientError  # noqa: E402
from gpuyard.services.submit.dashboard.pages import NAV, PAGES  # noqa: E402
from tests.browser.conftest import raise_gpu_xid  # noqa: E402
from tests.unit.services.submit.onnxmodels import tiny_model  # noqa: E402

NODE = "node-a"
MODEL = "tiny-pages"
ALERT_NODE = "node-pages"
VOLUME = "pages-data"
VOLUME_FILE = "a-folder-with-a-rather-long-name-for-a-phone/and-a-file-with-a-long-name-in-it-too.csv"
KEEPS = 'echo done; printf ok > "$GPUYARD_OUTPUT_DIR/result-with-a-long-name-for-a-phone-screen.txt"'


@dataclass(frozen=True)
class Address:
    """One view of a page: its script (pages.PAGES), an address, and what shows once it has drawn its data."""

    name: str
    """Of its screenshots."""
    script: str
    path: str
    drawn: tuple[str, ...]
    admin_only: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def populated(yard):
    """The platform with something on every page, all of it the `vision` tenant's but one `nlp` job."""
    vision = Client(yard.server, yard.tokens["vision"], timeout=30)
    nlp = Client(yard.server, yard.tokens["nlp"], timeout=30)

    def submit(client: Client, name: str, command: str, gpus: float) -> str:
        spec = {"name": name, "command": command, "resources": {"gpus": gpus, "cpus": 0.1, "memory": "256MB"}}
        return client.request("POST", "/v1/jobs", json=spec)["job_id"]

    jobs = {
        "finished": submit(vision, "finished", KEEPS, 1),
        "failed": submit(vision, "fails", "echo about to fail; exit 3", 0),
        "running": submit(vision, "a-training-run-with-a-rather-long-name", "sleep 600", 2),
        "shared": submit(nlp, "half-a-gpu", "sleep 600", 0.5),
    }
    clients = {"finished": vision, "failed": vision, "running": vision, "shared": nlp}
    vision.request(
        "POST", "/v1/models", params={"name": MODEL}, content=tiny_model(2.0),
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    vision.request("POST", "/v1/volumes", json={"name": VOLUME, "size": "1GB"})
    vision.request(
        "PUT", f"/v1/volumes/{VOLUME}/content", params={"path": VOLUME_FILE}, content=b"a,b\n1,2\n",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    try:
        vision.request(
            "POST", f"/v1/models/{MODEL}/deployments", json={"gpus": 0.25, "cpus": 0.1, "memory": "256MB"}
        )
        for key in ("running", "shared"):
            yard.wait_state(jobs[key], {"running"}, timeout=60)
        yard.wait_state(jobs["finished"], {"succeeded"}, timeout=60)
        yard.wait_state(jobs["failed"], {"failed"}, timeout=60)
        jobs["waiting"] = submit(vision, "waits-for-every-gpu", "sleep 1", 8)
        clients["waiting"] = vision
        raise_gpu_xid(yard, ALERT_NODE)
        wait_for_replica(vision)
        yield jobs
    finally:
        for key, job_id in jobs.items():
            with contextlib.suppress(ClientError):
                clients[key].request("POST", f"/v1/jobs/{job_id}/cancel")
        with contextlib.suppress(ClientError):
            vision.request("DELETE", f"/v1/models/{MODEL}/deployments")
        with contextlib.suppress(ClientError):
            vision.request("DELETE", f"/v1/volumes/{VOLUME}")


def wait_for_replica(client: Client, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not any(
        r["state"] == "running" for r in client.request("GET", f"/v1/models/{MODEL}/deployments")["replicas"]
    ):
        assert time.monotonic() < deadline, f"no replica of {MODEL} ready in {timeout} s"
        time.sleep(0.3)


def addresses(jobs: dict[str, str]) -> list[Address]:
    return [
        Address(
            "cluster", "cluster.js", "/", (f".cell[data-node='{NODE}']", "#queues-table", "#models-table")
        ),
        Address("jobs", "jobs.js", "/jobs", (f"tr[data-job='{jobs['waiting']}']",)),
        Address(
            "job-running",
            "job.js",
            f"/jobs/{jobs['running']}",
            ("#why-summary", "#placements", "#attempts", "#timeline"),
        ),
        Address("job-waiting", "job.js", f"/jobs/{jobs['waiting']}", ("#why", "#timeline")),
        Address("job-failed", "job.js", f"/jobs/{jobs['failed']}", ("#attempts", "#timeline")),
        Address("job-finished", "job.js", f"/jobs/{jobs['finished']}", ("#outputs-table", "#timeline")),
        Address("submit", "submit.js", "/submit", ("#verdict .ok",)),
        Address(
            "models",
            "models.js",
            f"/models?model={MODEL}&tenant=vision",
            ("#versions-table", "#replicas-table"),
        ),
        Address(
            "volumes",
            "volumes.js",
            f"/volumes?tenant=vision&volume={VOLUME}&path={VOLUME_FILE.split('/')[0]}",
            ("#volumes-table", "#volume-quota", "#files-table tr[data-kind='file']"),
        ),
        Address(
            "alerts",
            "alerts.js",
            "/alerts",
            ("#usage-chart",),
            admin_only=(f"tr[data-alert='gpu_xid/{ALERT_NODE}/0']",),
        ),
        Address("tenants", "tenants.js", "/tenants", ("#tenants-table",), admin_only=("#tokens-table",)),
        Address("nodes", "nodes.js", f"/nodes?node={NODE}", (f"#gpus-{NODE}",)),
        Address("environments", "environments.js", "/environments", ("#pythons tr.node-pythons",)),
        Address("dev", "dev.js", "/dev", ("#dev-form", "#dev-list")),
    ]


def test_the_addresses_cover_every_page(populated):
    assert {a.script for a in addresses(populated)} == {p.script for p in PAGES}


def show(board, address: Address, admin: bool) -> None:
    """Open the address and wait until the page drew its data and its event stream is open."""
    page = board.page
    if address.script == "models.js":  # (its request rates come from the serving entry point a moment later)
        with page.expect_request_finished(lambda r: r.url.endswith("/metrics"), timeout=30_000):
            page.goto(address.path)
    else:
        page.goto(address.path)
    for selector in address.drawn + (address.admin_only if admin else ()):
        expect(page.locator(selector).first).to_be_visible(timeout=20_000)
    expect(page.locator("#live")).to_have_text("live", timeout=20_000)
    expect(page.locator("header.top nav a")).to_have_text([p.nav for p in NAV])


@pytest.mark.parametrize("who", ["admin", "vision"])
def test_every_page_writes_no_error_or_warning_to_the_console(dashboard, populated, who):
    board = dashboard(who)
    page = board.page
    for address in addresses(populated):
        show(board, address, who == "admin")
        for field in page.locator("input[pattern]").all():  # (a pattern is compiled when a value is checked,
            field.fill("team-a")  # as its form's submit does)
            assert field.evaluate("input => input.checkValidity()")
        assert "`" not in page.locator("body").inner_text(), f"{address.name}: a `quote` not set as code"
    page.goto("about:blank")  # (the last page's messages all delivered)
    assert board.console == [], "\n".join(board.console)
    assert board.errors == []


@pytest.mark.parametrize("width", [390, 1400])
def test_every_page_fits_the_width_of_the_screen(dashboard, populated, width):
    board = dashboard("admin", width=width, height=860)
    page = board.page
    wider = []
    for address in addresses(populated):
        show(board, address, admin=True)
        page.evaluate("window.scrollTo(0, 0)")
        board.screenshot(f"{width}-{address.name}")
        scroll_width, inner_width = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
        if scroll_width > inner_width:
            wider.append(f"{address.name}: {scroll_width} px")
    assert not wider, f"pages wider than {width} px: {wider}"
