"""A real Slurm cluster (cluster.py) for the whole session, and `gpuyard up` whose executor serves it
(GPUYARD_EXECUTOR_BACKEND=slurm). Where Slurm cannot run here, the tests skip and say why."""

from __future__ import annotations

import pytest

from ..conftest import Platform, wait_for
from .cluster import SlurmCluster, Unavailable


@pytest.fixture(scope="session")
def slurm_cluster():
    try:
        cluster = SlurmCluster().start()
    except Unavailable as why:
        pytest.skip(f"no Slurm cluster: {why}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slurm_platform(slurm_cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("slurm-platform")
    platform = start_platform(slurm_cluster, base)
    yield platform
    if platform.proc.poll() is None:
        platform.stop()
    slurm_cluster.cancel_all()


def platform_settings(cluster: SlurmCluster, **env: str) -> dict[str, str]:
    """The environment of a `gpuyard up` whose executor serves `cluster`, quick to notice what Slurm does."""
    return {
        "GPUYARD_EXECUTOR_BACKEND": "slurm",
        "GPUYARD_SLURM_POLL_INTERVAL": "0.2",
        "GPUYARD_HEARTBEAT_INTERVAL": "1",
        "GPUYARD_GRACE_SECONDS": "3",
        "GPUYARD_MIN_RUNTIME_BEFORE_PREEMPTION": "0",
        "GPUYARD_PREEMPTION_GRACE": "3",
        "GPUYARD_ACCEPT_UNPLACEABLE": "true",  # (a job waits while Slurm jobs outside hold GPUs)
        **cluster.env,
        **env,
    }


def start_platform(cluster: SlurmCluster, base, **env: str) -> Platform:
    """`gpuyard up` with the Slurm backend, once it announces the cluster's node with its GPUs."""
    settings = platform_settings(cluster, **env)
    platform = Platform(base / "data", base / "config", simulate_gpus=0, executors=1, env=settings).start()
    client = platform.client()
    wait_for(
        lambda: any(n["node"] == cluster.node and n["gpus"] for n in client.request("GET", "/v1/nodes")),
        30,
        what=f"Slurm node {cluster.node} announced",
    )
    return platform
