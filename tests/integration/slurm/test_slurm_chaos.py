"""The crash test on the Slurm backend (benchmarks/chaos.py's `run_chaos`, as tests/chaos runs it on local
processes): short jobs and two gangs through a platform whose executor serves the test's Slurm cluster, while the
executor is killed with SIGKILL twice, NATS once, and slurmctld is restarted once (its jobs run on under slurmd,
`sbatch` waits for it). Every accepted job must succeed exactly once: none lost, none run twice, none stuck.

slurmctld is stopped with SIGTERM, not SIGKILL: a controller killed outright forgets the jobs it accepted since
it last saved its state (Slurm's own durability, not GPUYARD's), and a job Slurm forgets is lost to any client."""

from __future__ import annotations

import pytest

from benchmarks.chaos import Outside, Shape, run_chaos

from .conftest import platform_settings
from .test_slurm_backend import SMALL

pytestmark = pytest.mark.integration

JOBS = 80
GANG_EVERY = 40
SCHEDULE = ["executor", "executor", "nats", "slurmctld"]
UNFINISHED_AFTER = 300
"""Seconds after which a job that has not ended counts as stuck: a bound on the wait, not a speed claim."""


def test_every_slurm_job_succeeds_once_while_the_executor_nats_and_slurmctld_go(slurm_cluster, tmp_path):
    result = run_chaos(
        jobs=JOBS,
        gang_every=GANG_EVERY,
        seed=7,
        deadline=UNFINISHED_AFTER,
        workdir=tmp_path,
        schedule=SCHEDULE,
        outside={"slurmctld": Outside(slurm_cluster.restart_controller, slurm_cluster.controller_back)},
        gpus=0,
        env=platform_settings(slurm_cluster, GPUYARD_JOB_USERS="*=platform"),
        executors=1,
        shape=Shape(
            job_gpus=0.25, gang_replicas=4, gang_gpus=1, memory=SMALL["memory"]
        ),  # (4 GPUs, 4 shards each)
        hostile=False,
    )
    summary = result.summary()
    print(summary)
    assert sorted(k.target for k in result.kills) == sorted(SCHEDULE), result.kills
    assert all(k.back_after_s is not None for k in result.kills), result.kills
    assert result.accepted == JOBS, summary
    assert result.gangs == JOBS // GANG_EVERY, summary
    assert not result.lost, f"accepted, unknown to the API: {result.lost[:10]}"
    assert not result.twice, f"replicas that ran more than once: {result.twice[:10]}"
    assert not result.stuck, f"still open when the wait gave up: {result.stuck[:10]}"
    assert not result.failed, f"finished without success: {result.failed[:10]}"
    assert result.succeeded == JOBS, summary
