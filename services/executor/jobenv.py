"""The environment a replica runs in: the job's own env, GPU pinning, and torchrun-style distributed vars."""

from __future__ import annotations

import os

from shared.events import JobPlaced, ReplicaPlacement
from shared.jobspec import JobSpec

# Variables from the executor's own environment that jobs inherit; everything else is the job's.
INHERITED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "PYTHONPATH",
    "VIRTUAL_ENV",
)


def replica_env(
    *,
    job_id: str,
    job_name: str,
    tenant: str,
    spec: JobSpec,
    placed: JobPlaced,
    replica: ReplicaPlacement,
    master_addr: str,
    master_port: int,
    simulated: bool,
) -> dict[str, str]:
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    env.update(spec.env)
    on_node = sorted(p.replica for p in placed.placements if p.node == replica.node)
    gpus = replica.gpus
    visible = ",".join(str(g.index) if simulated or not g.uuid else g.uuid for g in gpus)
    env.update(
        {
            "GPUYARD_JOB_ID": job_id,
            "GPUYARD_JOB_NAME": job_name,
            "GPUYARD_TENANT": tenant,
            "GPUYARD_ATTEMPT": str(placed.attempt),
            "GPUYARD_REPLICA": str(replica.replica),
            "GPUYARD_NODE": replica.node,
            "GPUYARD_GPUS": ",".join(str(g.index) for g in gpus),
            "CUDA_VISIBLE_DEVICES": visible,
            "WORLD_SIZE": str(len(placed.placements)),
            "RANK": str(replica.replica),
            "LOCAL_RANK": str(on_node.index(replica.replica)),
            "LOCAL_WORLD_SIZE": str(len(on_node)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )
    if simulated:
        env["GPUYARD_SIMULATED_GPUS"] = "1"
    shared = [g for g in gpus if g.fraction < 1]
    if shared:
        env["GPUYARD_GPU_MEMORY_FRACTION"] = f"{shared[0].fraction:g}"
        if shared[0].memory_bytes:
            env["GPUYARD_GPU_MEMORY_BYTES"] = str(shared[0].memory_bytes)
    return env
