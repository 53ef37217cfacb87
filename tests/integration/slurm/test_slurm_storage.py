"""What a job keeps and reads beyond its attempt, on the Slurm backend against a real slurmctld and slurmd: its
volume at its path in the working directory (and in GPUYARD_VOLUME_<NAME>), its checkpoint folder, which its
second attempt finds as the first left it, and its output folder, served by the API once the job has ended."""

from __future__ import annotations

import httpx
import pytest

from ..conftest import wait_for
from .test_slurm_backend import SMALL

pytestmark = pytest.mark.integration

RESUMING = """
echo "reads $(cat data/hello.txt) from $GPUYARD_VOLUME_DATASET"
[ "$GPUYARD_VOLUME_DATASET" = "$PWD/data" ] || exit 10
[ -d "$GPUYARD_CHECKPOINT_DIR" ] && [ -d "$GPUYARD_OUTPUT_DIR" ] || exit 11
step="$GPUYARD_CHECKPOINT_DIR/step"
if [ -e "$step" ]; then
    echo "attempt $GPUYARD_ATTEMPT resumes from step $(cat "$step")"
    echo trained > "$GPUYARD_OUTPUT_DIR/result"
    exit 0
fi
echo 1 > "$step"
echo "attempt $GPUYARD_ATTEMPT saved step 1"
exit 3
"""
"""The first attempt reads the volume, saves a checkpoint and fails (the job's retry runs a second one); the
second finds the checkpoint and writes an output."""


def test_a_job_reads_its_volume_resumes_from_its_checkpoint_and_keeps_its_output(slurm_platform):
    client = slurm_platform.client()
    client.request("POST", "/v1/volumes", json={"name": "dataset", "size": 1000})
    client.request("PUT", "/v1/volumes/dataset/content", params={"path": "hello.txt"}, content=b"hello")
    spec = {
        "name": "resumes",
        "command": RESUMING,
        "max_retries": 1,
        "resources": SMALL,
        "volumes": [{"name": "dataset", "path": "data", "read_only": True}],
    }
    job_id = client.submit(spec).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=90)
    assert (job.state, job.attempt) == ("succeeded", 2), job

    first = wait_for(
        lambda: (t := client.logs(job_id, attempt=1)) and "saved" in t and t, 20, what="its output"
    )
    assert "reads hello from " in first and "attempt 1 saved step 1" in first, first
    second = wait_for(
        lambda: (t := client.logs(job_id, attempt=2)) and "resumes" in t and t, 20, what="output"
    )
    assert "reads hello from " in second and "attempt 2 resumes from step 1" in second, second

    started = [e.event["data"] for e in client.events(job_id) if e.event["type"] == "io.gpuyard.job.started"]
    assert len(started) == 2
    for attempt in started:  # (a batch job runs in its node's own mount namespace: the volume is a link)
        assert any("read-only not enforced on this node for volume dataset" in n for n in attempt["notes"]), (
            attempt
        )

    listed = client.request("GET", f"/v1/jobs/{job_id}/artifacts")
    assert [(i["path"], i["kind"]) for i in listed["items"]] == [("result", "file")], listed
    got = httpx.get(
        f"{slurm_platform.server}/v1/jobs/{job_id}/artifacts/content",
        params={"path": "result"},
        headers=dict(client.http.headers),
        timeout=30,
    )
    assert (got.status_code, got.content) == (200, b"trained\n"), got.text
