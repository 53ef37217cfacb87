"""A job's page shows the outputs it keeps (what it writes to GPUYARD_OUTPUT_DIR, docs/storage.md) once it has
any, while it runs too: each listed with a link that downloads it, a folder opened in place or downloaded as a
tar; a job that kept nothing shows no outputs part."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

WRITES = (
    'mkdir -p "$GPUYARD_OUTPUT_DIR/metrics" && printf 0.91 > "$GPUYARD_OUTPUT_DIR/accuracy.txt" && '
    'printf "step,loss\\n1,0.5\\n" > "$GPUYARD_OUTPUT_DIR/metrics/loss.csv" && sleep 600'
)


def test_a_running_jobs_outputs_show_on_its_page_with_working_links(dashboard):
    board = dashboard("vision")
    spec = {"name": "keeps-outputs", "command": WRITES, "resources": {"gpus": 0, "cpus": 0.1}}
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        page = board.page
        page.goto(f"/jobs/{job_id}")
        outputs = page.locator("#job-outputs")
        file_row = outputs.locator("#outputs-table tr[data-path='accuracy.txt']")
        expect(file_row).to_contain_text("4 B", timeout=30_000)  # once written: no event says so
        expect(outputs.locator("#outputs-table tr[data-path='metrics'] a[data-open]")).to_have_text(
            "metrics/"
        )
        board.screenshot("job-outputs")
        with page.expect_download() as download:
            file_row.locator("a.download").click()
        assert download.value.suggested_filename == "accuracy.txt"
        assert Path(download.value.path()).read_bytes() == b"0.91"

        with page.expect_download() as download:
            outputs.locator("#outputs-table tr[data-path='metrics'] a.download").click()
        assert download.value.suggested_filename == "metrics.tar"
        with tarfile.open(fileobj=io.BytesIO(Path(download.value.path()).read_bytes())) as tar:
            assert tar.extractfile("metrics/loss.csv").read() == b"step,loss\n1,0.5\n"

        outputs.locator("#outputs-table tr[data-path='metrics'] a[data-open]").click()
        expect(page.locator("#outputs-path")).to_contain_text("outputs / metrics")
        expect(page).to_have_url(re.compile(r"\?outputs=metrics$"))
        loss = outputs.locator("#outputs-table tr[data-path='metrics/loss.csv']")
        with page.expect_download() as download:
            loss.locator("a.download").click()
        assert Path(download.value.path()).read_bytes() == b"step,loss\n1,0.5\n"

        with page.expect_download() as download:
            page.click("#outputs-download")  # all of them, as one tar
        with tarfile.open(fileobj=io.BytesIO(Path(download.value.path()).read_bytes())) as tar:
            names = set(tar.getnames())
        assert {n.split("/", 1)[-1] for n in names} >= {"accuracy.txt", "metrics/loss.csv"}, names
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")
    page.goto("about:blank")
    assert board.console == [], "\n".join(board.console)


def test_a_job_that_kept_nothing_shows_no_outputs(dashboard):
    board = dashboard("vision")
    spec = {"name": "keeps-nothing", "command": "echo nothing kept", "resources": {"gpus": 0, "cpus": 0.1}}
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    board.yard.wait_state(job_id, {"succeeded"}, timeout=60)
    page = board.page
    listed = f"/v1/jobs/{job_id}/artifacts"
    with page.expect_response(lambda r: r.url.endswith(listed) and r.status == 200) as answered:
        page.goto(f"/jobs/{job_id}")
    assert answered.value.json()["items"] == []
    expect(page.locator("#timeline li[data-kind='job.succeeded']")).to_have_count(1)
    expect(page.locator("#job-outputs")).to_be_hidden()
