"""Jobs' kept outputs in an object store through the real platform: `gpuyard up` with
`GPUYARD_OUTPUT_STORE=s3://BUCKET/kept` and the standard AWS variables pointing at moto's S3 server on loopback
(tests/s3server.py). A job writes to its GPUYARD_OUTPUT_DIR; once it has ended, its files are objects in the
bucket (its log says what was copied), and the API serves them from there even with the node's folder gone."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Iterator

import httpx
import pytest

from gpuyard.client import Client
from tests.integration.conftest import Platform, platform_on_s3
from tests.s3server import S3Server

pytestmark = pytest.mark.integration

WRITER = """
import os, pathlib
out = pathlib.Path(os.environ["GPUYARD_OUTPUT_DIR"])
(out / "sub dir").mkdir(exist_ok=True)
(out / "result.txt").write_text("42")
(out / "sub dir" / "métrique.tsv").write_text("step\\tloss\\n1\\t0.5\\n")
"""


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory) -> Iterator[tuple[Platform, S3Server, str]]:
    base = tmp_path_factory.mktemp("output-store")
    with platform_on_s3(base, "GPUYARD_OUTPUT_STORE", "kept", simulate_gpus=1, executors=1) as found:
        yield found


def test_a_jobs_outputs_are_copied_when_it_ends_and_served_from_the_bucket(on_s3):
    platform, server, bucket = on_s3
    admin = platform.client()
    vision = Client(platform.server, admin.create_token(tenant="vision", user="ana").token, timeout=30)
    spec = {"command": ["python", "-c", WRITER], "resources": {"gpus": 0, "cpus": 0.1, "memory": "100MB"}}
    job_id = vision.submit({**spec, "name": "writer"}).job_id
    job = platform.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
    assert job.state == "succeeded", job.message

    assert server.objects(bucket, f"kept/outputs/vision/{job_id}") == {
        "result.txt": 2,
        "sub dir/métrique.tsv": len(b"step\tloss\n1\t0.5\n"),
    }
    assert "outputs: copied 2 file(s), 18 B, to the output store" in vision.logs(job_id)

    [local] = [p for p in platform.data_dir.parent.glob(f"**/outputs/vision/{job_id}") if p.is_dir()]
    shutil.rmtree(local)  # (the node's copy gone: what follows comes from the bucket)
    listed = vision.request("GET", f"/v1/jobs/{job_id}/artifacts")
    assert [(i["path"], i["kind"]) for i in listed["items"]] == [("result.txt", "file"), ("sub dir", "dir")]
    whole = httpx.get(
        f"{platform.server}/v1/jobs/{job_id}/artifacts/content", headers=dict(vision.http.headers), timeout=30
    )
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert files == {
        f"{job_id}-outputs/result.txt": b"42",
        f"{job_id}-outputs/sub dir/métrique.tsv": b"step\tloss\n1\t0.5\n",
    }
