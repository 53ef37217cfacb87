"""Browser tests of the dashboard: Playwright for Python driving Debian's Chromium (`/usr/bin/chromium`;
`.ci/run` installs it) against one `gpuyard up --simulate-gpus 8` for the whole module set.

Screenshots of the pages go to `test-artifacts/screenshots/` (git-ignored). Where Chromium or Playwright is
missing the tests skip and say so; in CI (`CI=true`) that is a failure instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuyard.client import Client
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuReading, GpuSample
from tests.integration.conftest import Platform

CHROMIUM = os.environ.get("GPUYARD_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
VOLUME_QUOTA = "*=200GB"
"""What each tenant's volumes may hold together on the browser tests' platform (the Volumes page's quota bar)."""
CHROMIUM_ARGS = [  # this machine's network is closed: no background connections, no QUIC
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="package")
def browser():
    """Chromium, for the browser tests only: Playwright's sync API holds an event loop while it runs, and the
    asynchronous tests of the packages after this one need the thread's loop free."""
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests cannot run in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="package")
def yard(tmp_path_factory):
    """The platform every browser test uses (stopped once they ran): 8 simulated GPUs, a volume quota per tenant
    (`VOLUME_QUOTA`), and a token per tenant (`yard.tokens`)."""
    base = tmp_path_factory.mktemp("dashboard")
    env = {"GPUYARD_VOLUME_QUOTA": VOLUME_QUOTA}
    platform = Platform(base / "data", base / "config", simulate_gpus=8, executors=1, env=env).start()
    admin = platform.client()
    platform.tokens = {"admin": admin.token}
    for tenant, user in (("vision", "ana"), ("nlp", "bo")):
        created = admin.request("POST", "/v1/admin/tokens", json={"tenant": tenant, "user": user})
        platform.tokens[tenant] = created["token"]
    yield platform
    if platform.proc.poll() is None:
        platform.stop()


def raise_gpu_xid(yard, node: str) -> None:
    """A fatal XID on a GPU of `node`, published as a node's monitor does: the monitor raises gpu_xid at once."""
    sample = GpuSample(
        node=node,
        gpus=[GpuReading(index=0, uuid="GPU-ghost-0", utilization_pct=0, memory_used_bytes=0,
                         memory_total_bytes=1 << 30, temperature_c=40, xids=[79])],
    )  # fmt: skip

    async def go():
        bus = await yard.bus("monitor")
        try:
            await bus.publish(make_event(sample, source="/test/monitor"))
        finally:
            await bus.close()

    with ThreadPoolExecutor(1) as thread:  # (Playwright's own loop runs in this one)
        thread.submit(asyncio.run, go()).result(timeout=30)


class Dashboard:
    """One logged-in browser context on the dashboard, with helpers the tests share. `console` collects what
    the pages wrote to the console as errors or warnings (a test that wants none asserts it empty)."""

    def __init__(self, browser, yard, who: str, width: int = 1366, height: int = 860):
        self.yard = yard
        self.token = yard.tokens[who]
        self.context = browser.new_context(base_url=yard.server, viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.console: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", self._console)
        self.page.set_default_timeout(15_000)
        self.login(who)

    def _console(self, message) -> None:
        if message.type in ("error", "warning"):
            where = message.location
            self.console.append(
                f"{message.type}: {message.text} ({where.get('url')}:{where.get('lineNumber')})"
            )

    def login(self, who: str) -> None:
        self.page.goto("/")
        self.page.fill("#token", self.yard.tokens[who])
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("header.top nav")

    def api(self, method: str, path: str, **kwargs):
        """The API with this user's bearer token (to set up what a test then looks at)."""
        return Client(self.yard.server, self.token, timeout=30).request(method, path, **kwargs)

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        assert not self.errors, f"JavaScript errors on the dashboard: {self.errors}"
        self.context.close()


@pytest.fixture
def dashboard(browser, yard):
    """`dashboard("vision")`: a browser logged in as that tenant's user (or "admin"); `width=390` for a phone's
    viewport."""
    opened: list[Dashboard] = []

    def open_as(who: str, **viewport) -> Dashboard:
        board = Dashboard(browser, yard, who, **viewport)
        opened.append(board)
        return board

    yield open_as
    for board in opened:
        board.close()
