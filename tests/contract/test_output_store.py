"""Jobs' kept outputs in an object store (`GPUYARD_OUTPUT_STORE`, `OutputStore`), served by moto's S3 server on
loopback (tests/s3server.py): what the executor copies after an attempt (only what changed, never a link nor
another user's file), what the API lists and sends from there for the job's tenant only, and what the retention
removes with the job."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit import retention
from gpuyard.services.submit.app import create_app
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.paths import job_storage
from gpuyard.shared.runtime.safefolder import SafeFolder
from gpuyard.shared.runtime.tarstream import PathRefused
from tests.s3server import pointed_at
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}


@pytest.fixture
def store(s3_server, tmp_path, monkeypatch) -> Iterator[OutputStore]:
    with pointed_at(s3_server, tmp_path, monkeypatch) as bucket:
        yield OutputStore(f"s3://{bucket}/kept é")


@pytest.fixture
def ctx(tmp_path, store):
    with submit_context(tmp_path, job_outputs=store) as context:
        yield context


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def kept(root: Path, job_id: str, tenant: str = "vision") -> Path:
    """A job's output folder as its replicas leave it: files, a folder, a non-ASCII name, a link pointing out."""
    top = Path(job_storage(root, tenant, job_id).outputs)
    (top / "metrics").mkdir(parents=True)
    (top / "model.bin").write_bytes(b"\x00\x01weights" * 100)
    (top / "metrics" / "perte é.tsv").write_text("0\t1.5\n1\t0.9\n")
    (root / "secret").write_text("not the job's")
    os.symlink(root / "secret", top / "escape")
    aged(top)
    return top


def aged(top: Path) -> None:
    """Every file written 100 s ago: older than any copy (the store's times are whole seconds)."""
    for path in top.rglob("*"):
        st = path.lstat()
        os.utime(path, (st.st_atime - 100, st.st_mtime - 100), follow_symlinks=False)


def publish(store: OutputStore, root: Path, job_id: str) -> tuple[int, int]:
    """What the executor copies once an attempt has ended: (files, bytes)."""
    return store.publish("vision", job_id, SafeFolder(job_storage(root, "vision", job_id).outputs))


def submit(api) -> str:
    answer = api.post("/v1/jobs", json=SPEC, headers=VISION)
    assert answer.status_code == 202, answer.text
    return answer.json()["job_id"]


def test_what_changed_is_copied_and_served_to_the_jobs_tenant_alone(api, store, tmp_path):
    job_id = submit(api)
    root = tmp_path / "node-storage"
    top = kept(root, job_id)
    assert publish(store, root, job_id) == (2, 912)

    listed = api.get(f"/v1/jobs/{job_id}/artifacts", headers=VISION).json()
    assert [(i["path"], i["kind"]) for i in listed["items"]] == [("metrics", "dir"), ("model.bin", "file")]
    one = api.get(f"/v1/jobs/{job_id}/artifacts/content", params={"path": "model.bin"}, headers=VISION)
    assert one.status_code == 200 and one.content == b"\x00\x01weights" * 100
    whole = api.get(f"/v1/jobs/{job_id}/artifacts/content", headers=VISION)
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert files == {
        f"{job_id}-outputs/model.bin": b"\x00\x01weights" * 100,
        f"{job_id}-outputs/metrics/perte é.tsv": b"0\t1.5\n1\t0.9\n",
    }  # (the link left out)
    assert api.get(f"/v1/jobs/{job_id}/artifacts", headers=NLP).status_code == 404

    (top / "model.bin").write_bytes(b"better weights")
    (top / "final.txt").write_text("done")
    assert publish(store, root, job_id) == (2, 18)
    one = api.get(f"/v1/jobs/{job_id}/artifacts/content", params={"path": "model.bin"}, headers=VISION)
    assert one.content == b"better weights"
    aged(top)
    assert publish(store, root, job_id) == (0, 0)


async def test_the_retention_removes_a_jobs_kept_outputs_with_it(api, ctx, store, tmp_path):
    gone, stays = submit(api), submit(api)
    root = tmp_path / "node-storage"
    for job_id in (gone, stays):
        (Path(job_storage(root, "vision", job_id).outputs)).mkdir(parents=True)
        (Path(job_storage(root, "vision", job_id).outputs) / "out.txt").write_text(job_id)
        publish(store, root, job_id)

    class Expired:
        async def expired(self, ended_before: str, limit: int) -> list[str]:
            return [gone]

        async def compact(self, job_id: str) -> None:
            pass

        async def reclaim(self) -> None:
            pass

    assert await retention.sweep(Expired(), None, 60, outputs=store) == 1
    assert store.folder("vision", gone).usage() == (0, 0)
    assert store.folder("vision", stays).usage() == (1, len(stays))


@pytest.mark.parametrize(
    ("tenant", "job_id"), [("../vision", "0123456789abcdef"), ("vision", "../x"), ("vision", "")]
)
def test_no_key_is_built_outside_a_jobs_prefix(store, tenant, job_id):
    with pytest.raises(PathRefused):
        store.prefix(tenant, job_id)
