"""A job's kept outputs through the API (`/v1/jobs/{id}/artifacts`, `…/content`): listed a folder at a time,
a file sent as it is and a folder as a tar stream, for the job's tenant and admins only; a job that kept nothing
lists empty; no path leaves the job's output folder (`..`, absolute, NUL, a link pointing out, a hard link to a
file of another user)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import JobOutputs
from gpuyard.shared.runtime.jobusers import JobUser
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
ADMIN = {"Authorization": "Bearer tok-admin"}
SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}
JOB_UID = 4242
"""The user vision's jobs run as, where a test makes them run as one (root only)."""


@pytest.fixture
def owners():
    """Who vision's jobs run as, by tenant (none: the platform's own user); a test may set one."""
    return {}


@pytest.fixture
def api(tmp_path, owners):
    def owner_of(tenant: str) -> JobUser | None:
        return owners.get(tenant)

    outputs = JobOutputs(tmp_path / "storage", owner_of)
    with submit_context(tmp_path, job_outputs=outputs) as ctx, TestClient(create_app(ctx)) as client:
        yield client


def submit(api, headers=VISION) -> str:
    answer = api.post("/v1/jobs", json=SPEC, headers=headers)
    assert answer.status_code == 202, answer.text
    return answer.json()["job_id"]


def kept(tmp_path, job_id: str, tenant: str = "vision"):
    """The job's output folder, as the executor makes it, with a file, a folder and a file in it."""
    top = tmp_path / "storage" / "outputs" / tenant / job_id
    (top / "metrics").mkdir(parents=True)
    (top / "model.bin").write_bytes(b"\x00\x01weights" * 100)
    (top / "metrics" / "loss.tsv").write_text("0\t1.5\n1\t0.9\n")
    return top


def tar_of(data: bytes) -> dict[str, bytes | None]:
    """A tar stream's entries: a file's bytes, None for a folder."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() if m.isfile() else None for m in tar.getmembers()}


def test_a_jobs_outputs_are_listed_a_folder_at_a_time(api, tmp_path):
    job = submit(api)
    kept(tmp_path, job)
    top = api.get(f"/v1/jobs/{job}/artifacts", headers=VISION)
    assert top.status_code == 200, top.text
    listed = top.json()
    assert listed["path"] == "" and not listed["truncated"]
    assert [(i["path"], i["kind"], i["size_bytes"]) for i in listed["items"]] == [
        ("metrics", "dir", listed["items"][0]["size_bytes"]),
        ("model.bin", "file", 900),
    ]
    inner = api.get(f"/v1/jobs/{job}/artifacts", params={"path": "metrics/"}, headers=VISION).json()
    assert inner["path"] == "metrics"
    assert [(i["path"], i["kind"]) for i in inner["items"]] == [("metrics/loss.tsv", "file")]
    by_prefix = api.get(f"/v1/jobs/{job[:6]}/artifacts", headers=VISION).json()  # (a unique prefix names it)
    assert by_prefix == listed


def test_a_file_is_sent_as_it_is_and_a_folder_as_a_tar_stream(api, tmp_path):
    job = submit(api)
    kept(tmp_path, job)
    file = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "metrics/loss.tsv"}, headers=VISION)
    assert file.status_code == 200, file.text
    assert file.content == b"0\t1.5\n1\t0.9\n"
    assert file.headers["content-type"] == "application/octet-stream"
    assert file.headers["content-disposition"] == 'attachment; filename="loss.tsv"'
    whole = api.get(f"/v1/jobs/{job}/artifacts/content", headers=VISION)
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/x-tar"
    assert f'filename="{job}-outputs.tar"' in whole.headers["content-disposition"]
    assert tar_of(whole.content) == {
        f"{job}-outputs/metrics": None,
        f"{job}-outputs/metrics/loss.tsv": b"0\t1.5\n1\t0.9\n",
        f"{job}-outputs/model.bin": b"\x00\x01weights" * 100,
    }
    folder = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "metrics"}, headers=VISION)
    assert tar_of(folder.content) == {"metrics/loss.tsv": b"0\t1.5\n1\t0.9\n"}


def test_a_job_that_kept_nothing_lists_empty_and_a_path_not_there_is_404(api, tmp_path):
    job = submit(api)  # (queued: the executor has made no output folder)
    listed = api.get(f"/v1/jobs/{job}/artifacts", headers=VISION)
    assert listed.status_code == 200 and listed.json() == {"path": "", "items": [], "truncated": False}
    whole = api.get(f"/v1/jobs/{job}/artifacts/content", headers=VISION)
    assert whole.status_code == 200 and tar_of(whole.content) == {}
    for route in ("artifacts", "artifacts/content"):
        missing = api.get(f"/v1/jobs/{job}/{route}", params={"path": "model.bin"}, headers=VISION)
        assert missing.status_code == 404, (route, missing.text)
    kept(tmp_path, job)
    for route, path in (("artifacts", "nope"), ("artifacts/content", "nope.bin"), ("artifacts", "metrics/x")):
        missing = api.get(f"/v1/jobs/{job}/{route}", params={"path": path}, headers=VISION)
        assert missing.status_code == 404 and "detail" in missing.json(), (route, path, missing.text)


def test_another_tenants_job_is_none_and_an_admin_sees_every_tenants(api, tmp_path):
    job = submit(api, headers=NLP)
    kept(tmp_path, job, tenant="nlp")
    for route in ("artifacts", "artifacts/content"):
        for params in ({}, {"path": "model.bin"}, {"path": "metrics"}):
            refused = api.get(f"/v1/jobs/{job}/{route}", params=params, headers=VISION)
            assert refused.status_code == 404 and refused.json()["detail"] == f"no job {job!r}"
    mine = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "model.bin"}, headers=NLP)
    assert mine.content == b"\x00\x01weights" * 100
    theirs = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "model.bin"}, headers=ADMIN)
    assert theirs.content == mine.content
    assert api.get("/v1/jobs/nope/artifacts", headers=VISION).status_code == 404
    assert api.get(f"/v1/jobs/{job}/artifacts").status_code == 401


@pytest.mark.parametrize("path", ["..", "../nlp", "metrics/../../x", "/etc", "/", "a\0b", "x" * 5000])
def test_a_path_that_leaves_the_output_folder_is_refused(api, tmp_path, path):
    job = submit(api)
    kept(tmp_path, job)
    for route in ("artifacts", "artifacts/content"):
        refused = api.get(f"/v1/jobs/{job}/{route}", params={"path": path}, headers=VISION)
        assert refused.status_code in (400, 422), (route, refused.text)  # (422: over 4096 characters)
        assert "detail" in refused.json()


def test_a_link_the_job_made_is_never_followed(api, tmp_path):
    job = submit(api)
    top = kept(tmp_path, job)
    secret = tmp_path / "secret.txt"
    secret.write_text("the platform's")
    (top / "file-out").symlink_to(secret)
    (top / "dir-out").symlink_to(tmp_path)
    listed = api.get(f"/v1/jobs/{job}/artifacts", headers=VISION).json()["items"]
    assert {i["path"]: i["kind"] for i in listed}["file-out"] == "other"
    for route, path in (
        ("artifacts/content", "file-out"),
        ("artifacts/content", "dir-out/secret.txt"),
        ("artifacts/content", "dir-out"),
        ("artifacts", "dir-out"),
    ):
        refused = api.get(f"/v1/jobs/{job}/{route}", params={"path": path}, headers=VISION)
        assert refused.status_code in (400, 404), (route, path, refused.status_code)
        assert "platform's" not in refused.text
    whole = tar_of(api.get(f"/v1/jobs/{job}/artifacts/content", headers=VISION).content)
    assert set(whole) == {
        f"{job}-outputs/metrics",
        f"{job}-outputs/metrics/loss.tsv",
        f"{job}-outputs/model.bin",
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of two users")
def test_a_hard_link_to_a_file_of_another_user_is_not_read(api, tmp_path, owners):
    """Where jobs run as their tenant's user, the API (root) reads only that user's files from the folder."""
    owners["vision"] = JobUser(JOB_UID, JOB_UID, "gpuyard-vision")
    job = submit(api)
    top = kept(tmp_path, job)
    secret = tmp_path / "secret.txt"
    secret.write_text("the platform's")
    os.link(secret, top / "hard")
    for path in (top, top / "metrics", top / "metrics" / "loss.tsv", top / "model.bin"):
        os.chown(path, JOB_UID, JOB_UID)
    own = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "model.bin"}, headers=VISION)
    assert own.status_code == 200 and own.content == b"\x00\x01weights" * 100
    refused = api.get(f"/v1/jobs/{job}/artifacts/content", params={"path": "hard"}, headers=VISION)
    assert refused.status_code == 404 and "platform's" not in refused.text
    whole = tar_of(api.get(f"/v1/jobs/{job}/artifacts/content", headers=VISION).content)
    assert (
        f"{job}-outputs/hard" not in whole and whole[f"{job}-outputs/model.bin"] == b"\x00\x01weights" * 100
    )


def test_without_the_storage_root_the_routes_say_so(tmp_path):
    with submit_context(tmp_path) as ctx, TestClient(create_app(ctx)) as api:
        job = submit(api)
        for route in ("artifacts", "artifacts/content"):
            answer = api.get(f"/v1/jobs/{job}/{route}", headers=VISION)
            assert answer.status_code == 503 and "not available" in answer.json()["detail"]


def test_a_name_no_file_can_have_is_404_not_an_error(api, tmp_path):
    job = submit(api)
    kept(tmp_path, job)
    for route in ("artifacts", "artifacts/content"):
        for path in ("n" * 300, "metrics/" + "é" * 200):
            missing = api.get(f"/v1/jobs/{job}/{route}", params={"path": path}, headers=VISION)
            assert missing.status_code == 404, (route, missing.text)
