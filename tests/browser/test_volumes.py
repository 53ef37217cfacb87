"""The dashboard's Volumes page in a real browser: make a volume from the page, see what it reserves of the
tenant's volume quota, upload files from the browser into the folder shown with each one's progress bar going
to 100 %, see them listed, download one (the same bytes) and a folder (a tar), an upload that does not fit shows
the API's reason (413) and leaves nothing, remove a file; a volume that a live job mounts shows it and is not
deleted (the API's reason shown, 409), then is deleted once the job ended. A volume's use reads in the units of
its size ("3.15 MB used of 8 MB", not "3 MiB"), what the volumes reserve in those of the quota. No error or
warning on the console but the browser's own lines for the two refusals the test asks for."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

from gpuyard.shared.contracts.units import format_size  # noqa: E402

VOLUME = "browser-data"
SIZE = 8 * 10**6  # "8MB"
SI_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))
THROTTLED = {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 2 * 10**6}
RECORD_PERCENTS = """() => {
  window.__percents = {};
  new MutationObserver((changes) => {
    for (const c of changes) {
      const row = c.target.closest('li[data-file]');
      if (!row) continue;
      (window.__percents[row.dataset.file] ??= []).push(Number(c.target.dataset.percent));
    }
  }).observe(document.getElementById('uploads'), {subtree: true, attributes: true, attributeFilter: ['data-percent']});
}"""


def refusals_only(console: list[str], statuses: set[int]) -> list[str]:
    """The console's lines but the browser's own "Failed to load resource" for the refusals a test asked for."""
    asked = re.compile(
        r"error: Failed to load resource: the server responded with a status of (\d+) "
    )  # fmt: skip
    return [line for line in console if not ((m := asked.match(line)) and int(m[1]) in statuses)]


def in_si_units(n: int) -> str:
    """`n` bytes in SI units, three figures, as the page writes a part beside a whole written so (8 MB)."""
    for unit, factor in SI_UNITS:
        if n >= factor:
            return f"{float(f'{n / factor:.3g}'):g} {unit}"
    return f"{n} B"


def payload(name: str, data: bytes) -> dict:
    return {"name": name, "mimeType": "application/octet-stream", "buffer": data}


def upload_from_the_page(page, files: list[dict]) -> None:
    page.set_input_files("#upload-files", files)
    page.click("#upload-send")


def make_volume(board) -> None:
    page = board.page
    page.goto("/volumes")
    expect(page.locator("#volume-quota")).to_contain_text("volume quota")
    page.fill("#v-name", VOLUME)
    page.fill("#v-size", "8MB")
    page.click("#volume-create")
    expect(page.locator("#create-message .ok")).to_have_text(f"Made volume {VOLUME} (8 MB).")
    row = page.locator(f"#volumes-table tr[data-volume='{VOLUME}']")
    expect(row).to_contain_text("8 MB")
    expect(row.locator(".used")).to_have_text("0 B · 0 %")
    expect(page.locator("#volume-name")).to_contain_text(VOLUME)
    expect(page.locator("#volume .empty")).to_contain_text("This volume is empty.")
    assert f"volume={VOLUME}" in page.url


def test_make_a_volume_upload_with_progress_download_remove_and_delete(dashboard):
    board = dashboard("vision")
    page = board.page
    page.on("dialog", lambda dialog: dialog.accept())
    make_volume(board)
    reserved = sum(v["size_bytes"] for v in board.api("GET", "/v1/volumes")["items"])
    expect(page.locator("#volume-quota")).to_contain_text(f"{in_si_units(reserved)} reserved of 200 GB")
    board.api(
        "PUT", f"/v1/volumes/{VOLUME}/content", params={"path": "train/seed.txt"}, content=b"seed",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    folder = page.locator("#files-table tr[data-path='train'] a[data-open]")
    expect(folder).to_have_text("train/")  # live: volume.files_written
    folder.click()
    expect(page.locator("#volume-path")).to_contain_text(f"{VOLUME} / train")
    expect(page.locator("#files-table tr[data-path='train/seed.txt']")).to_have_count(1)
    expect(page.locator("#upload-target")).to_have_text(f"into {VOLUME}/train/")
    big, notes = os.urandom(3 * 2**20), "the notes, é\n".encode()
    upload_with_progress(board, {"big.bin": big, "notes with spaces.txt": notes})
    board.screenshot("volume-uploaded")
    download_a_file_and_a_folder(page, big, notes)
    an_upload_too_big_is_refused(board)
    page.click("#files-table tr[data-path='train'] a[data-open]")
    page.click("#files-table tr[data-path='train/seed.txt'] button.remove")
    expect(page.locator("#volume-message .ok")).to_have_text("Removed train/seed.txt: 1 file, 4 B.")
    expect(page.locator("#files-table tr[data-path='train/seed.txt']")).to_have_count(0)
    use_reads_in_the_units_of_the_size(page, len(big) + len(notes))
    deleted_once_no_live_job_mounts_it(board)
    page.goto("about:blank")  # (the last page's messages all delivered)
    assert refusals_only(board.console, {409, 413}) == [], "\n".join(board.console)


def use_reads_in_the_units_of_the_size(page, used: int) -> None:
    """A volume made as "8MB" holding 3 MiB and a few bytes: "3.15 MB · 39 %" beside its size "8 MB", "3.15 MB
    used of 8 MB" above its files; no binary unit beside the SI size (format_size alone writes "3 MiB")."""
    assert format_size(used) == "3 MiB" and in_si_units(used) == "3.15 MB"
    row = page.locator(f"#volumes-table tr[data-volume='{VOLUME}']")
    expect(row.locator(".used")).to_have_text(f"3.15 MB · {round(100 * used / SIZE)} %")
    expect(row.locator("td.num").first).to_have_text("8 MB")
    expect(row.locator(".use-bar")).to_have_attribute("aria-label", "3.15 MB used of 8 MB")
    expect(page.locator("#volume-figures")).to_have_text("3.15 MB used of 8 MB · 2 files")
    assert "iB" not in row.inner_text() + page.locator("#volume-figures").inner_text()


def upload_with_progress(board, files: dict[str, bytes]) -> None:
    """Upload `files` from the page into the folder shown, at 2 MB/s: each one's bar goes up to 100 %."""
    page = board.page
    page.evaluate(RECORD_PERCENTS)
    network = board.context.new_cdp_session(page)
    network.send("Network.enable")
    network.send("Network.emulateNetworkConditions", THROTTLED)
    upload_from_the_page(page, [payload(name, data) for name, data in files.items()])
    for name, data in files.items():
        row = page.locator(f"#uploads li[data-file='train/{name}']")
        size = format_size(len(data))
        expect(row.locator(".status")).to_have_text(f"uploaded {size}", timeout=30_000)
        expect(row.locator("progress")).to_have_attribute("data-percent", "100")
        expect(row.locator(".pct")).to_have_text("100 %")
        expect(page.locator(f"#files-table tr[data-path='train/{name}']")).to_contain_text(size)
    network.send("Network.emulateNetworkConditions", {**THROTTLED, "uploadThroughput": -1})
    biggest = max(files, key=lambda name: len(files[name]))
    percents = page.evaluate("window.__percents")[f"train/{biggest}"]
    assert percents == sorted(percents) and percents[-1] == 100, percents
    assert any(0 < p < 100 for p in percents), percents  # (seen on the way)


def download_a_file_and_a_folder(page, big: bytes, notes: bytes) -> None:
    with page.expect_download() as download:
        page.click("#files-table tr[data-path='train/big.bin'] a.download")
    assert download.value.suggested_filename == "big.bin"
    assert Path(download.value.path()).read_bytes() == big
    page.click("#volume-path a[data-open='']")  # back to the volume's top
    with page.expect_download() as download:
        page.click("#files-table tr[data-path='train'] a.download")
    assert download.value.suggested_filename == "train.tar"
    with tarfile.open(fileobj=io.BytesIO(Path(download.value.path()).read_bytes())) as tar:
        assert tar.extractfile("train/notes with spaces.txt").read() == notes


def an_upload_too_big_is_refused(board) -> None:
    upload_from_the_page(board.page, [payload("too-big.bin", os.urandom(6 * 2**20))])
    failed = board.page.locator("#uploads li.upload-failed[data-file='too-big.bin']")
    expect(failed.locator(".status")).to_contain_text(
        re.compile(r"the file \(6 MiB\) does not fit: volume 'browser-data' has .+ left of 8 MB")
    )
    expect(failed.locator(".pct")).to_have_text("not kept")
    described = board.api("GET", f"/v1/volumes/{VOLUME}")
    assert described["files"] == 3, described  # nothing of it kept


def deleted_once_no_live_job_mounts_it(board) -> None:
    page = board.page
    spec = {
        "name": "mounts-it", "command": "sleep 600", "resources": {"gpus": 0, "cpus": 0.1},
        "volumes": [{"name": VOLUME, "path": "data", "read_only": True}],
    }  # fmt: skip
    job_id = board.api("POST", "/v1/jobs", json=spec)["job_id"]
    try:
        mounted = page.locator(f"#volumes-table tr[data-volume='{VOLUME}'] td.mounted a")
        expect(mounted).to_have_attribute("href", f"/jobs/{job_id}")  # live: job.submitted
        top(page)
        board.screenshot("volumes")
        page.click("#volume-delete")
        expect(page.locator("#volume-message .error")).to_contain_text(
            f"volume '{VOLUME}' is mounted by live job {job_id}"
        )
    finally:
        board.api("POST", f"/v1/jobs/{job_id}/cancel")
    expect(mounted).to_have_count(0, timeout=30_000)  # live: job.cancelled
    page.click("#volume-delete")
    expect(page.locator("#volume-message .ok")).to_contain_text(f"Deleted volume {VOLUME}")
    expect(page.locator(f"#volumes-table tr[data-volume='{VOLUME}']")).to_have_count(0)


def top(page) -> None:
    page.evaluate("window.scrollTo(0, 0)")


def test_a_tenant_never_sees_another_tenants_volume(dashboard):
    nlp = dashboard("nlp")
    nlp.api("POST", "/v1/volumes", json={"name": "nlp-private", "size": "1MB"})
    try:
        page = dashboard("vision").page
        page.goto("/volumes?volume=nlp-private&tenant=nlp")  # (a tenant's `tenant` is its own)
        expect(page.locator("#volume-quota")).to_contain_text("vision")
        expect(page.locator("#volumes-table tr[data-volume='nlp-private']")).to_have_count(0)
        expect(page.locator("#volume-name, #volume .empty").first).to_be_visible()
        assert "nlp-private" not in page.locator("#volume").inner_text()
        admin = dashboard("admin").page
        admin.goto("/volumes")
        admin.fill("#v-tenant", "nlp")
        admin.click("#tenant-form button")
        expect(admin.locator("#volumes-table tr[data-volume='nlp-private']")).to_have_count(1)
        expect(admin.locator("#volume-name")).to_contain_text("nlp-private")
        assert "tenant=nlp" in admin.url
    finally:
        nlp.api("DELETE", "/v1/volumes/nlp-private")
