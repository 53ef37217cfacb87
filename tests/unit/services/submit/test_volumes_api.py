"""`/v1/volumes` over HTTP against a real embedded store and real folders: making volumes within the tenant's
quota, uploads (a file, a tree) counted against the volume's room and all or nothing, listings and downloads,
paths that would leave the volume, deletion refused while a live job mounts it, and a spec naming a volume its
tenant does not have."""

from __future__ import annotations

import io
import tarfile

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}


@pytest.fixture
def api(tmp_path):
    with (
        submit_context(tmp_path, volumes=True, volume_quotas={"vision": 10_000}) as ctx,
        TestClient(create_app(ctx)) as client,
    ):
        yield client


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_volumes_are_made_within_the_tenants_quota(api):
    made = api.post("/v1/volumes", json={"name": "data", "size": "6kB"}, headers=VISION)
    assert made.status_code == 201, made.text
    assert made.json()["size_bytes"] == 6000
    assert api.post("/v1/volumes", json={"name": "data", "size": 10}, headers=VISION).status_code == 409
    over = api.post("/v1/volumes", json={"name": "more", "size": "5kB"}, headers=VISION)
    assert over.status_code == 422 and "volume quota" in over.json()["detail"], over.text
    listed = api.get("/v1/volumes", headers=VISION).json()
    assert [v["name"] for v in listed["items"]] == ["data"]
    assert (listed["quota_bytes"], listed["reserved_bytes"]) == (10_000, 6000)
    assert api.get("/v1/volumes", headers=NLP).json()["items"] == []


def test_uploads_fit_the_room_left_and_come_back_as_they_went(api):
    api.post("/v1/volumes", json={"name": "data", "size": 2000}, headers=VISION)
    put = api.put(
        "/v1/volumes/data/content", params={"path": "a/b c/ü.bin"}, content=b"x" * 1500, headers=VISION
    )
    assert put.status_code == 201, put.text
    assert put.json() == {"volume": "data", "path": "a/b c/ü.bin", "files": 1, "bytes": 1500}
    over = api.put("/v1/volumes/data/content", params={"path": "big"}, content=b"y" * 600, headers=VISION)
    assert over.status_code == 413 and "500 B left" in over.json()["detail"], over.text
    chunked = api.put(
        "/v1/volumes/data/content",
        params={"path": "big"},
        content=iter([b"y" * 300, b"y" * 300]),
        headers=VISION,
    )
    assert chunked.status_code == 413, chunked.text
    described = api.get("/v1/volumes/data", headers=VISION).json()
    assert (described["files"], described["used_bytes"], described["mounted_by"]) == (1, 1500, [])
    assert (
        api.get("/v1/volumes/data/content", params={"path": "a/b c/ü.bin"}, headers=VISION).content
        == b"x" * 1500
    )
    listing = api.get("/v1/volumes/data/files", params={"path": "a"}, headers=VISION).json()
    assert [(i["path"], i["kind"]) for i in listing["items"]] == [("a/b c", "dir")]
    whole = api.get("/v1/volumes/data/content", headers=VISION)
    assert whole.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        assert tar.extractfile("data/a/b c/ü.bin").read() == b"x" * 1500


def test_a_tree_is_unpacked_whole_or_not_at_all(api):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    tree = tar_of({"set/x.txt": b"1" * 100, "set/sub/y.txt": b"2" * 50})
    put = api.put(
        "/v1/volumes/data/content", params={"path": "in", "archive": True}, content=tree, headers=VISION
    )
    assert put.status_code == 201 and put.json()["files"] == 2, put.text
    escaping = tar_of({"set/ok.txt": b"1", "../out.txt": b"2"})
    refused = api.put(
        "/v1/volumes/data/content", params={"path": "", "archive": True}, content=escaping, headers=VISION
    )
    assert refused.status_code == 400 and "leaves the folder" in refused.json()["detail"], refused.text
    too_big = tar_of({"set/z.bin": b"3" * 900})
    refused = api.put(
        "/v1/volumes/data/content", params={"path": "", "archive": True}, content=too_big, headers=VISION
    )
    assert refused.status_code == 413, refused.text
    assert api.get("/v1/volumes/data", headers=VISION).json()["files"] == 2


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "a\0b"])
def test_a_path_that_leaves_the_volume_is_refused(api, path):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    for method in ("GET", "PUT", "DELETE"):
        answer = api.request(
            method, "/v1/volumes/data/content", params={"path": path}, content=b"x", headers=VISION
        )
        assert answer.status_code == 400, (method, answer.text)


def test_a_volume_a_live_job_mounts_is_not_deleted(api):
    api.post("/v1/volumes", json={"name": "data", "size": 1000}, headers=VISION)
    spec = {"command": "true", "volumes": [{"name": "data", "path": "d", "read_only": True}]}
    job = api.post("/v1/jobs", json=spec, headers=VISION)
    assert job.status_code == 202, job.text
    refused = api.delete("/v1/volumes/data", headers=VISION)
    assert refused.status_code == 409 and job.json()["job_id"] in refused.json()["detail"], refused.text
    assert api.get("/v1/volumes/data", headers=VISION).json()["mounted_by"] == [job.json()["job_id"]]
    assert api.post(f"/v1/jobs/{job.json()['job_id']}/cancel", headers=VISION).status_code == 202
    assert api.delete("/v1/volumes/data", headers=VISION).json()["name"] == "data"
    assert api.get("/v1/volumes/data", headers=VISION).status_code == 404
    again = api.post("/v1/volumes", json={"name": "data", "size": 10}, headers=VISION)  # the name is free
    assert again.status_code == 201 and api.get("/v1/volumes/data", headers=VISION).json()["files"] == 0


def test_a_spec_naming_a_volume_its_tenant_does_not_have_is_refused(api):
    api.post("/v1/volumes", json={"name": "theirs", "size": 1000}, headers=NLP)
    spec = {"command": "true", "volumes": [{"name": "theirs", "path": "d"}]}
    for route in ("/v1/jobs", "/v1/jobs/validate"):
        answer = api.post(route, json=spec, headers=VISION)
        assert answer.status_code == 404 and "no volume 'theirs'" in answer.json()["detail"], answer.text
    assert api.get("/v1/jobs", headers=VISION).json()["items"] == []
