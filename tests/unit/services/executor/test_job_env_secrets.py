"""Jobs never receive the platform's bus credentials: a replica's environment holds what the job asked for and
a short list of the executor's own variables, none of them GPUYARD_NATS_*."""

from __future__ import annotations

from gpuyard.services.executor.jobenv import replica_env
from gpuyard.shared.contracts.events.jobs import JobPlaced, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec


def test_a_replica_gets_no_nats_setting_of_the_executor(monkeypatch):
    monkeypatch.setenv("GPUYARD_NATS_CREDENTIALS", "/data/bus/executor.json")
    monkeypatch.setenv("GPUYARD_NATS_URL", "nats://127.0.0.1:4222")
    monkeypatch.setenv("GPUYARD_NATS_TLS_CA", "/etc/gpuyard/ca.pem")
    placement = ReplicaPlacement(replica=0, node="n")
    env = replica_env(
        job_id="j1",
        job_name="j",
        tenant="t",
        spec=JobSpec(command="env"),
        placed=JobPlaced(job_id="j1", attempt=1, placements=[placement]),
        replica=placement,
        master_addr="127.0.0.1",
        master_port=29500,
        simulated=True,
    )
    assert env["GPUYARD_JOB_ID"] == "j1"
    assert not [name for name in env if name.startswith("GPUYARD_NATS")]
