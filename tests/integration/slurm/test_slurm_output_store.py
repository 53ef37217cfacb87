"""The Slurm backend with the platform's storage settings: a storage root of its own (`GPUYARD_STORAGE_ROOT`,
which the compute nodes share) holds a job's output folder, and an output store (`GPUYARD_OUTPUT_STORE`, moto's S3
on loopback: tests/s3server.py) gets a copy of it once the job has ended, which the API serves from there."""

from __future__ import annotations

import shutil

import pytest

from tests.s3server import UNSET, S3Server, aws_env

from ..conftest import Platform
from .conftest import platform_settings
from .test_slurm_backend import SMALL

pytestmark = pytest.mark.integration

WRITER = 'echo -n 42 > "$GPUYARD_OUTPUT_DIR/result.txt"'


def test_a_slurm_jobs_outputs_are_in_the_storage_root_and_copied_to_the_output_store(slurm_cluster, tmp_path):
    root = tmp_path / "shared-storage"
    with S3Server() as server:
        bucket = server.new_bucket()
        env = {
            **aws_env(server.endpoint, tmp_path),
            "GPUYARD_OUTPUT_STORE": f"s3://{bucket}/kept",
            "GPUYARD_STORAGE_ROOT": str(root),
        }
        platform = Platform(
            tmp_path / "data",
            tmp_path / "config",
            simulate_gpus=0,
            executors=1,
            env=platform_settings(slurm_cluster, **env),
        )
        for name in UNSET:
            platform.env.pop(name, None)
        platform.start()
        try:
            client = platform.client()
            job_id = client.submit({"name": "writer", "command": WRITER, "resources": SMALL}).job_id
            job = platform.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
            assert job.state == "succeeded", job
            kept = root / "outputs" / "default" / job_id
            assert (kept / "result.txt").read_text() == "42"
            assert server.objects(bucket, f"kept/outputs/default/{job_id}") == {"result.txt": 2}
            assert "outputs: copied 1 file(s), 2 B, to the output store" in client.logs(job_id)
            shutil.rmtree(kept)  # (the storage root's copy gone: what follows comes from the bucket)
            listed = client.request("GET", f"/v1/jobs/{job_id}/artifacts")
            assert [(i["path"], i["kind"]) for i in listed["items"]] == [("result.txt", "file")], listed
        finally:
            platform.stop()
            slurm_cluster.cancel_all()
