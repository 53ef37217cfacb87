"""Volumes through `gpuyard up` (real NATS, real processes, the CLI as typed): a tenant makes a volume, uploads a
dataset (a tree with spaces and non-ASCII names), two jobs read it where they mount it, a write to a read-only
mount is refused where the node enforces it (and said where it does not), an upload over the volume's size is
refused with nothing left, another tenant is refused on every route and in a job's spec, and a volume a live job
mounts cannot be deleted."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from gpuyard.client import Client, ClientError

from .conftest import BIN, Platform

pytestmark = pytest.mark.integration

READER = """
import os, sys
top = os.environ["GPUYARD_VOLUME_DATASET"]
print("sees", sorted(os.listdir(os.path.join(top, "set"))), flush=True)
print("reads", open(os.path.join("data", "set", "sub dir", "ünï.txt")).read(), flush=True)
try:
    open(os.path.join("data", "written-by-job"), "w").write("x")
    print("wrote", flush=True)
except OSError as exc:
    print("refused", exc.strerror, flush=True)
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("volumes")
    p = Platform(base / "data", base / "config", simulate_gpus=2, executors=1).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(scope="module")
def tenants(platform):
    admin = platform.client()
    vision = Client(platform.server, admin.create_token(tenant="vision", user="ana").token, timeout=30)
    nlp = Client(platform.server, admin.create_token(tenant="nlp", user="bo").token, timeout=30)
    return vision, nlp


def cli(platform: Platform, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {**platform.env, "GPUYARD_SERVER": platform.server, "GPUYARD_TOKEN": token}
    return subprocess.run([str(BIN / "gpuyard"), *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_dataset_goes_in_once_and_jobs_read_it_where_they_mount_it(platform, tenants, tmp_path):
    vision, _ = tenants
    token = vision.http.headers["Authorization"].split()[1]
    made = cli(platform, token, "volumes", "create", "dataset", "--size", "1MB")
    assert made.returncode == 0, made.stderr
    dataset = tmp_path / "set"
    (dataset / "sub dir").mkdir(parents=True)
    (dataset / "sub dir" / "ünï.txt").write_text("héllo")
    (dataset / "a.bin").write_bytes(os.urandom(1000))
    sent = cli(platform, token, "volumes", "upload", "dataset", str(dataset))
    assert sent.returncode == 0, sent.stderr
    assert "2 file(s)" in sent.stdout
    listed = cli(platform, token, "volumes", "files", "dataset", "set/sub dir")
    assert "ünï.txt" in listed.stdout, listed.stdout

    spec = {
        "command": ["python", "-c", READER],
        "resources": {"gpus": 0, "cpus": 0.1, "memory": "100MB"},
        "volumes": [{"name": "dataset", "path": "data", "read_only": True}],
    }
    jobs = [vision.submit({**spec, "name": f"reader-{i}"}).job_id for i in range(2)]
    for job_id in jobs:
        job = platform.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
        assert job.state == "succeeded", job.message
        output = vision.logs(job_id)
        assert "sees ['a.bin', 'sub dir']" in output and "reads héllo" in output, output
        started = [
            e.event["data"] for e in vision.events(job_id) if e.event["type"] == "io.gpuyard.job.started"
        ]
        notes = " ".join(started[-1]["notes"])
        if "read-only not enforced" in notes:
            assert "wrote" in output, output
        else:
            assert "refused Read-only file system" in output, (output, notes)
    if os.geteuid() == 0:  # a root platform: its jobs get a namespace of their own, so read-only is enforced
        assert "refused Read-only file system" in vision.logs(jobs[0])
    described = cli(platform, token, "volumes", "describe", "dataset")
    assert "1.0 kB" in described.stdout or "files" in described.stdout, described.stdout


def test_an_upload_over_the_size_leaves_nothing(platform, tenants, tmp_path):
    vision, _ = tenants
    vision.request("POST", "/v1/volumes", json={"name": "small", "size": 1000})
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 5000)
    token = vision.http.headers["Authorization"].split()[1]
    refused = cli(platform, token, "volumes", "upload", "small", str(big))
    assert refused.returncode == 1 and "does not fit" in refused.stderr, refused.stderr
    chunked = httpx.put(  # a body of no declared length, refused as it comes
        f"{platform.server}/v1/volumes/small/content",
        params={"path": "big.bin"},
        content=iter([b"y" * 600, b"y" * 600]),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert chunked.status_code == 413, chunked.text
    assert vision.request("GET", "/v1/volumes/small/files")["items"] == []
    uploads = platform.data_dir.parent.glob("**/volumes/vision/.uploads/*")
    assert [p for p in uploads if p.suffix == ".part"] == []


def test_another_tenant_is_refused_on_every_route_and_in_a_spec(platform, tenants):
    vision, nlp = tenants
    vision.request("POST", "/v1/volumes", json={"name": "private", "size": 1000})
    for method, path, kwargs in [
        ("GET", "/v1/volumes/private", {}),
        ("GET", "/v1/volumes/private/files", {}),
        ("GET", "/v1/volumes/private/content", {"params": {"path": ""}}),
        ("PUT", "/v1/volumes/private/content", {"params": {"path": "x"}, "content": b"x"}),
        ("DELETE", "/v1/volumes/private/content", {"params": {"path": "x"}}),
        ("DELETE", "/v1/volumes/private", {}),
        ("GET", "/v1/volumes/private", {"params": {"tenant": "vision"}}),
    ]:
        with pytest.raises(ClientError, match="HTTP 404"):
            nlp.request(method, path, **kwargs)
    assert [v["name"] for v in nlp.request("GET", "/v1/volumes")["items"]] == []
    with pytest.raises(ClientError, match="HTTP 404"):
        nlp.submit({"command": "true", "volumes": [{"name": "private", "path": "data"}]})
    assert nlp.jobs().items == []


def test_a_mounted_volume_is_not_deleted(platform, tenants):
    vision, _ = tenants
    vision.request("POST", "/v1/volumes", json={"name": "busy", "size": 1000})
    job_id = vision.submit(
        {
            "command": "sleep 600",
            "resources": {"gpus": 0, "cpus": 0.1},
            "volumes": [{"name": "busy", "path": "b"}],
        }
    ).job_id
    platform.wait_state(job_id, {"running"}, timeout=60)
    with pytest.raises(ClientError, match="mounted by live job.*HTTP 409"):
        vision.request("DELETE", "/v1/volumes/busy")
    vision.cancel(job_id)
    platform.wait_state(job_id, {"cancelled"}, timeout=60)
    assert vision.request("DELETE", "/v1/volumes/busy")["name"] == "busy"
    with pytest.raises(ClientError, match="HTTP 404"):
        vision.request("GET", "/v1/volumes/busy")
