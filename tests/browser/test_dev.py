"""The dashboard's Dev environments page: Start one, Open it (JupyterLab through the platform's proxy, in a tab
of its own), run a cell that prints its CUDA_VISIBLE_DEVICES and tenant; another tenant's user is refused (403 on
HTTP and on the WebSocket upgrade); Stop it. No console errors or warnings on the dashboard's own pages."""

from __future__ import annotations

import contextlib

import pytest

from gpuyard.client import ClientError

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from tests.browser.conftest import SCREENSHOTS  # noqa: E402


def run_in_first_cell(lab, code: str) -> None:
    """Type `code` into a new notebook's first cell once its kernel is idle, see it there, then run it.

    A notebook that has just opened may still render its cells (JupyterLab draws them lazily): keys typed then
    land in an editor that is replaced, and Shift+Enter runs an empty cell. So the cell's own text is the witness
    that the keys landed, and they are typed again (into the editor as it is now) until it shows them."""
    expect(lab.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(timeout=60_000)
    editor = lab.locator(".jp-Notebook .jp-Cell").first.locator(".cm-content")
    for _ in range(3):
        editor.click()
        expect(lab.locator(".jp-Notebook.jp-mod-editMode .cm-editor.cm-focused")).to_have_count(
            1, timeout=10_000
        )
        lab.keyboard.press("ControlOrMeta+A")
        lab.keyboard.type(code)
        with contextlib.suppress(AssertionError):
            expect(editor).to_have_text(code, timeout=10_000)
            break
    expect(editor).to_have_text(code)
    lab.keyboard.press("Shift+Enter")


def test_start_open_run_a_cell_and_stop_a_dev_environment(dashboard):
    board, other = dashboard("vision"), dashboard("nlp")
    page = board.page
    page.goto("/dev")
    page.fill("#dev-gpus", "0.5")
    page.fill("#dev-name", "explore")
    page.click("#dev-start-button")
    expect(page.locator("#dev-action-result")).to_contain_text("Started dev environment explore")
    row = page.locator("tr.dev-environment", has_text="explore")
    job_id = row.locator("[data-stop]").get_attribute("data-stop")
    assert job_id
    try:
        opener = row.locator("[data-open]")
        expect(opener).to_be_visible(timeout=60_000)  # (once it runs)
        board.screenshot("dev-environments")
        with board.context.expect_page() as opened:
            opener.click()
        lab = opened.value  # (a page that says it is starting, then JupyterLab: it asks again each second)
        lab.set_default_timeout(60_000)
        lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
        run_in_first_cell(
            lab, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUYARD_TENANT'])"
        )
        expect(lab.locator(".jp-OutputArea-output").first).to_contain_text("vision", timeout=60_000)
        expect(lab.get_by_text("official Jupyter news")).to_have_count(0)  # (it asks at start: long since)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        lab.screenshot(path=str(SCREENSHOTS / "dev-jupyterlab.png"))  # (the lab's tab, not the dashboard's)
        lab.close()

        status = other.page.evaluate("(id) => fetch(`/dev/${id}/api/status`).then((r) => r.status)", job_id)
        assert status == 403
        refused = other.page.evaluate(
            """(id) => new Promise((done) => {
                const ws = new WebSocket(`ws://${location.host}/dev/${id}/api/events/subscribe`);
                ws.onopen = () => done("opened");
                ws.onerror = () => done("refused");
            })""",
            job_id,
        )
        assert refused == "refused"

        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("[data-stop]").click()
        expect(page.locator("#dev-action-result")).to_contain_text("cancel requested")
        expect(page.locator("tr.dev-environment", has_text="explore")).to_have_count(0, timeout=30_000)
    finally:
        with contextlib.suppress(ClientError):  # (stopped above already)
            board.api("DELETE", f"/v1/dev/{job_id}")
    page.goto("about:blank")
    assert board.console == [], "\n".join(board.console)
    other.page.goto("about:blank")
    other.console.clear()  # (Chromium says the refused fetch and upgrade on the console: that refusal is the test)
