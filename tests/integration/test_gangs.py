"""A gang of 16 replicas on one node, through the whole platform: it is placed on the node's simulated GPUs
(eighth-GPU shares, or no GPU), its replicas exit together, and it ends with every exit recorded (a
regression test: from nine replicas on one node on, the job once stayed running for ever)."""

from __future__ import annotations

import pytest

from gpuyard.shared.contracts.jobstate import JobState

pytestmark = pytest.mark.integration
REPLICAS = 16


@pytest.mark.parametrize("gpus", [0.125, 0])
def test_a_gang_of_16_on_one_node_is_placed_and_ends_with_every_exit(platform, gpus):
    client = platform.client()
    small = {"gpus": gpus, "cpus": 0.05, "memory": "16MB"}  # (16 of the defaults exceed a small machine)
    job_id = client.submit(
        {"name": "gang", "command": "true", "replicas": REPLICAS, "resources": small}
    ).job_id
    job = platform.wait_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=60)
    assert job.state == JobState.SUCCEEDED
    assert {p.node for p in job.placements} == {"node-a"} and len(job.placements) == REPLICAS
    if gpus:
        shares = [g for p in job.placements for g in p.gpus]
        assert sorted({g.index for g in shares}) == [0, 1] and {g.fraction for g in shares} == {gpus}
    exits = [e for e in client.events(job_id) if e.event["type"].endswith("replica_exited")]
    assert len(exits) == REPLICAS
