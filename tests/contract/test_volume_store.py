"""The volume API's contract on each store its files may live in (`GPUYARD_VOLUME_STORE`, docs/volumes.md):

- `folder`: folders of the storage root (the default);
- `s3`: an S3 bucket through s3fs, served by moto's S3 server on loopback (tests/s3server.py), pointed at as a
  user points it at MinIO: `s3://bucket/prefix` and the standard AWS variables.

The volume API's own cases (tests/unit/services/submit/test_volumes_api.py) run here on both; then what every
store does besides: a folder with spaces and non-ASCII names goes up and comes back (listed, a file and the tar),
files and folders are removed, a deleted volume leaves nothing, an upload past the room or cut short leaves
nothing (no staging object either), stale staging objects are swept, and a read-write mount of a volume in an
object store is refused at submit."""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit import volumeobjects
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.volumeobjects import STAGING, ObjectVolumes
from gpuyard.shared.runtime import objectfolder
from gpuyard.shared.runtime.tarstream import PathRefused
from gpuyard.shared.runtime.uploadfile import OverQuota
from tests.s3server import S3Server, pointed_at
from tests.unit.services.submit.submitctx import submit_context
from tests.unit.services.submit.test_volumes_api import (  # noqa: F401  (run here on each store)
    VISION,
    tar_of,
    test_a_path_that_leaves_the_volume_is_refused,
    test_a_spec_naming_a_volume_its_tenant_does_not_have_is_refused,
    test_a_tree_is_unpacked_whole_or_not_at_all,
    test_a_volume_a_live_job_mounts_is_not_deleted,
    test_uploads_fit_the_room_left_and_come_back_as_they_went,
    test_volumes_are_made_within_the_tenants_quota,
)

FOLDER, S3 = "folder", "s3"
PREFIX = "volume store é"
"""The store's key prefix in the bucket: a space and a non-ASCII letter."""


@pytest.fixture(params=[FOLDER, S3])
def store(request, tmp_path, monkeypatch) -> Iterator[tuple[str, S3Server | None, str]]:
    """(kind, its S3 server, its bucket) with the AWS variables pointing at the server for `s3`."""
    if request.param == FOLDER:
        yield FOLDER, None, ""
        return
    server: S3Server = request.getfixturevalue("s3_server")
    with pointed_at(server, tmp_path, monkeypatch) as bucket:
        yield S3, server, bucket


@pytest.fixture
def ctx(store, tmp_path, request):
    kind, _, bucket = store
    quota = getattr(request, "param", 10_000)
    with submit_context(tmp_path, volumes=True, volume_quotas={"vision": quota}) as context:
        if kind == S3:
            context.volume_files = ObjectVolumes(
                f"s3://{bucket}/{PREFIX}", tmp_path / "storage", lambda t: None
            )
        yield context


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def stored(ctx, store) -> dict[str, int]:
    """Every file the store holds for volumes, staging included: key -> size."""
    kind, server, bucket = store
    if kind == S3:
        return server.objects(bucket, PREFIX)
    root = ctx.volume_files.root
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


TREE = {"set é/a b.txt": b"1" * 100, "set é/sous dossier/ü.bin": b"2" * 50, "set é/日本.txt": b"3"}


def test_a_folder_with_spaces_and_non_ascii_names_goes_up_and_comes_back(api, ctx, store):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    put = api.put(
        "/v1/volumes/data/content",
        params={"path": "in", "archive": True},
        content=tar_of(TREE),
        headers=VISION,
    )
    assert put.status_code == 201 and put.json()["files"] == 3 and put.json()["bytes"] == 151, put.text
    listing = api.get("/v1/volumes/data/files", params={"path": "in/set é"}, headers=VISION).json()
    assert [(i["path"], i["kind"]) for i in listing["items"]] == [
        ("in/set é/a b.txt", "file"), ("in/set é/sous dossier", "dir"), ("in/set é/日本.txt", "file"),
    ]  # fmt: skip
    one = api.get("/v1/volumes/data/content", params={"path": "in/set é/sous dossier/ü.bin"}, headers=VISION)
    assert one.content == b"2" * 50 and one.headers["content-length"] == "50"
    tree = api.get("/v1/volumes/data/content", params={"path": "in"}, headers=VISION)
    with tarfile.open(fileobj=io.BytesIO(tree.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert got == {f"in/{name}": data for name, data in TREE.items()}
    described = api.get("/v1/volumes/data", headers=VISION).json()
    assert (described["files"], described["used_bytes"]) == (3, 151)
    assert not [k for k in stored(ctx, store) if STAGING in k or ".uploads" in k]


@pytest.mark.parametrize("store", [S3], indirect=True)
def test_a_tree_of_files_sent_in_parts_and_in_small_batches_comes_back_whole(api, monkeypatch):
    """In an object store, small files go up and come down many at a time, a large one in parts: here every
    batch holds one file, and the 100-byte file counts as large."""
    monkeypatch.setattr(objectfolder, "SMALL_FILE", 60)
    monkeypatch.setattr(objectfolder, "BATCH_FILES", 1)
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    put = api.put(
        "/v1/volumes/data/content", params={"path": "", "archive": True}, content=tar_of(TREE), headers=VISION
    )
    assert put.status_code == 201 and put.json()["files"] == 3, put.text
    tree = api.get("/v1/volumes/data/content", params={"path": "set é"}, headers=VISION)
    with tarfile.open(fileobj=io.BytesIO(tree.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert got == TREE


def test_files_and_folders_are_removed_and_a_deleted_volume_leaves_nothing(api, ctx, store):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    api.put(
        "/v1/volumes/data/content", params={"path": "", "archive": True}, content=tar_of(TREE), headers=VISION
    )
    gone = api.delete("/v1/volumes/data/content", params={"path": "set é/a b.txt"}, headers=VISION)
    assert gone.json()["files"] == 1 and gone.json()["bytes"] == 100, gone.text
    gone = api.delete("/v1/volumes/data/content", params={"path": "set é/sous dossier"}, headers=VISION)
    assert gone.json()["files"] == 1 and gone.json()["bytes"] == 50, gone.text
    missing = api.delete("/v1/volumes/data/content", params={"path": "set é/nothing"}, headers=VISION)
    assert missing.status_code == 404, missing.text
    assert api.get("/v1/volumes/data", headers=VISION).json()["files"] == 1
    assert api.delete("/v1/volumes/data", headers=VISION).json()["freed_bytes"] == 1
    assert [k for k in stored(ctx, store) if "/data/" in k] == []


def test_an_upload_past_the_room_or_cut_short_leaves_nothing(api, ctx, store):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    over = api.put(
        "/v1/volumes/data/content",
        params={"path": "big"},
        content=iter([b"y" * 600, b"y" * 600]),
        headers=VISION,
    )
    assert over.status_code == 413, over.text
    files = ctx.volume_files
    staging = files.staging("vision", 1000)  # the route's steps, cut short after the first chunk
    staging.write(b"z" * 500)
    staging.discard()
    with pytest.raises(OverQuota):
        staged = files.staging("vision", 10)
        try:
            staged.write(b"z" * 11)
        finally:
            staged.discard()
    assert api.get("/v1/volumes/data", headers=VISION).json()["files"] == 0
    assert [k for k in stored(ctx, store) if not k.endswith("/")] == []


@pytest.mark.parametrize("ctx", [40 << 20], indirect=True)
def test_a_file_upload_is_seen_only_whole_and_a_refused_one_leaves_nothing(api, ctx, store):
    """In S3 a file goes straight to its key as a multipart upload (more than one part here): nothing is seen
    there before `place_file` completes it, and one refused (a folder where the file would go) is aborted."""
    kind, server, bucket = store
    api.post("/v1/volumes", json={"name": "data", "size": 40 << 20}, headers=VISION)
    api.put("/v1/volumes/data/content", params={"path": "taken/x"}, content=b"x", headers=VISION)
    files = ctx.volume_files
    body = b"q" * (volumeobjects.PART_SIZE + 7)
    for path, refused in (("weights/model.bin", False), ("taken", True)):
        staged = files.staging("vision", 40 << 20, ("data", path))
        try:
            staged.write(body)
            staged.finish()
            assert not [k for k in stored(ctx, store) if k.endswith(path)]
            if refused:
                with pytest.raises(PathRefused):
                    files.place_file("vision", "data", staged, path)
            else:
                files.place_file("vision", "data", staged, path)
        finally:
            staged.discard()
    got = api.get("/v1/volumes/data/content", params={"path": "weights/model.bin"}, headers=VISION)
    assert got.status_code == 200 and got.content == body
    assert sorted(k.rsplit("/data/", 1)[-1] for k in stored(ctx, store) if "/data/" in k) == [
        "taken/x",
        "weights/model.bin",
    ]
    if kind == S3:
        assert server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_stale_staging_objects_are_swept(ctx, store, monkeypatch):
    kind, server, bucket = store
    if kind != S3:
        pytest.skip("the folder store's stale uploads: tests/unit/shared/runtime (staleuploads)")
    server.client().put_object(Bucket=bucket, Key=f"{PREFIX}/{STAGING}/dead/upload", Body=b"left")
    monkeypatch.setattr(time, "time", lambda: os.path.getmtime(__file__) + 10 * 365 * 86400)
    ctx.volume_files.staging("vision", 10).discard()
    assert stored(ctx, store) == {}


def test_a_read_write_mount_of_a_volume_in_an_object_store_is_refused(api, store):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    spec = {"command": "true", "volumes": [{"name": "data", "path": "d"}]}
    answer = api.post("/v1/jobs", json=spec, headers=VISION)
    if store[0] == FOLDER:
        assert answer.status_code == 202, answer.text
        return
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == (
        "volume 'data' lives in an object store: mount it read_only, write results to GPUYARD_OUTPUT_DIR"
    )
    read_only = {**spec, "volumes": [{"name": "data", "path": "d", "read_only": True}]}
    assert api.post("/v1/jobs", json=read_only, headers=VISION).status_code == 202
