"""The Slurm backend against a real slurmctld and slurmd (conftest.py): jobs placed by GPUYARD's scheduler run as
Slurm batch jobs pinned to their node, end with the same causes as on the other backends, and their output
reaches `gpuyard logs`; one past its memory is killed by Slurm as `oom_killed` (the test cluster polls
memory, `JobAcctGatherParams=OverMemoryKill`: it has no cgroup plugin)."""

from __future__ import annotations

import pytest

from gpuyard.services.executor.slurm.queue import ACTIVE

from ..conftest import wait_for
from .cluster import CPUS

pytestmark = pytest.mark.integration
SMALL = {"cpus": 1, "memory": "64MiB"}


def slurm_jobs(cluster, job_id: str) -> list[str]:
    """Slurm's lines (id|name|state) of the batch jobs of a GPUYARD job."""
    out = cluster.run("squeue", "-h", "--states=all", "-o", "%i|%j|%T").stdout
    return [line for line in out.splitlines() if f"gy-{job_id}-" in line]


def test_a_job_runs_as_a_slurm_batch_job_with_its_gpus_and_logs(slurm_platform, slurm_cluster):
    client = slurm_platform.client()
    command = 'echo "rank=$RANK world=$WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID"'
    job_id = client.submit({"name": "one", "command": command, "resources": {"gpus": 2, **SMALL}}).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=30)
    assert job.state == "succeeded", job
    # (GPUYARD reads the end from the batch script's exit file, before slurmctld has its own end of the batch job:
    # RUNNING until slurmd reports the batch script's end, then COMPLETING until the job's epilog is done)
    [line] = wait_for(
        lambda: (
            (lines := slurm_jobs(slurm_cluster, job_id))
            and lines[0].rsplit("|", 1)[1] not in ACTIVE
            and lines
        ),
        30,
        what="Slurm's end of the batch job",
    )
    assert line.endswith("|COMPLETED")
    text = wait_for(lambda: (t := client.logs(job_id)) and "rank=" in t and t, 20, what="the job's output")
    slurm_id = line.split("|")[0]
    assert f"rank=0 world=1 cvd=0,1 job={slurm_id}" in text or f"job={slurm_id}" in text, text
    assert len(text.split("cvd=")[1].split()[0].split(",")) == 2, text


def test_a_gang_of_two_is_two_batch_jobs_with_ranks_and_one_master(slurm_platform, slurm_cluster):
    client = slurm_platform.client()
    command = 'echo "rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT"'
    spec = {"name": "gang", "command": command, "replicas": 2, "resources": {"gpus": 1, **SMALL}}
    job_id = client.submit(spec).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=30)
    assert job.state == "succeeded", job
    assert len(slurm_jobs(slurm_cluster, job_id)) == 2
    for rank in (0, 1):
        text = wait_for(
            lambda rank=rank: (t := client.logs(job_id, replica=rank)) and "rank=" in t and t,
            20,
            what=f"replica {rank}'s output",
        )
        assert f"rank={rank} world=2 master=" in text, text


def test_fractional_jobs_share_a_gpu_through_slurm_shards(slurm_platform, slurm_cluster, tmp_path):
    client = slurm_platform.client()
    go = tmp_path / "go"
    command = f"while [ ! -e {go} ]; do sleep 0.1; done"
    halves = [
        client.submit({"name": f"half{i}", "command": command, "resources": {"gpus": 0.5, **SMALL}}).job_id
        for i in range(2)
    ]
    for job_id in halves:
        slurm_platform.wait_state(job_id, {"running"}, timeout=30)
    jobs = [client.job(job_id) for job_id in halves]
    assert (
        len({(p.node, g.index) for j in jobs for p in j.placements for g in p.gpus}) == 1
    )  # one GPU, two halves
    gres = slurm_cluster.run("squeue", "-h", "-o", "%j|%b").stdout
    for job_id in halves:
        assert f"gy-{job_id}-a1-r0|gres:shard:2" in gres, gres
    go.touch()
    for job_id in halves:
        assert slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=30).state == "succeeded"


def test_a_non_zero_exit_fails_the_job_with_its_code(slurm_platform):
    client = slurm_platform.client()
    job_id = client.submit({"name": "three", "command": "echo bad; exit 3", "resources": SMALL}).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=30)
    assert (job.state, job.attempts[-1].exit_code) == ("failed", 3), job


def test_cancel_sends_sigterm_and_the_slurm_job_ends(slurm_platform, slurm_cluster, tmp_path):
    client = slurm_platform.client()
    ready = tmp_path / "ready"
    command = f"trap 'echo got TERM; exit 0' TERM; touch {ready}; while true; do sleep 0.1; done"
    job_id = client.submit({"name": "cancel", "command": command, "resources": SMALL}).job_id
    slurm_platform.wait_state(job_id, {"running"}, timeout=30)
    wait_for(ready.exists, 20, what="the job's trap set")
    client.cancel(job_id)
    assert slurm_platform.wait_state(job_id, {"cancelled"}, timeout=30).state == "cancelled"
    wait_for(
        lambda: all("RUNNING" not in line for line in slurm_jobs(slurm_cluster, job_id)), 20, what="its end"
    )
    assert "got TERM" in wait_for(lambda: client.logs(job_id), 20, what="its output")


def test_a_timeout_stops_the_job_as_timed_out(slurm_platform):
    client = slurm_platform.client()
    spec = {"name": "slow", "command": "sleep 60", "timeout": 2, "resources": SMALL}
    job_id = client.submit(spec).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=40)
    assert job.state == "failed" and "timeout" in (job.attempts[-1].summary or ""), job


def test_a_higher_priority_job_preempts_through_slurm(slurm_platform, slurm_cluster):
    client = slurm_platform.client()
    whole = {"gpus": 4, **SMALL}
    low = client.submit({"name": "low", "command": "sleep 120", "priority": "low", "resources": whole}).job_id
    slurm_platform.wait_state(low, {"running"}, timeout=30)
    urgent = client.submit({"name": "urgent", "command": "true", "priority": "critical", "resources": whole})
    assert slurm_platform.wait_state(urgent.job_id, {"succeeded"}, timeout=60).state == "succeeded"
    job = wait_for(lambda: (j := client.job(low)).attempt >= 2 and j, 30, what="the low job requeued")
    assert job.attempts[0].summary == "preempted: priority", job.attempts
    first = [line for line in slurm_jobs(slurm_cluster, low) if "-a1-" in line]
    assert first and all("RUNNING" not in line for line in first), first
    client.cancel(low)
    slurm_platform.wait_state(low, {"cancelled"}, timeout=30)


def test_gpus_held_by_a_job_submitted_by_hand_are_not_placed_on(slurm_platform, slurm_cluster):
    client = slurm_platform.client()
    outside = slurm_cluster.sbatch("--gres=gpu:3", "--mem=64M", "-o", "/dev/null", "--wrap", "sleep 120")

    def announced() -> dict:
        return next(n for n in client.request("GET", "/v1/nodes") if n["node"] == slurm_cluster.node)

    try:
        wait_for(lambda: len(announced()["gpus"]) == 1, 20, what="3 GPUs held outside not announced")
    except AssertionError as exc:
        listed = slurm_cluster.run("squeue", "-h", "--states=all", "-o", "%i|%j|%T|%b|%r").stdout
        raise AssertionError(f"{exc}: announced {announced()}; Slurm lists:\n{listed}") from None
    said = f"Slurm node {slurm_cluster.node}: 3 GPU(s) held by Slurm jobs outside GPUYARD: {outside} (3)"
    wait_for(lambda: said in slurm_platform.log.read_text(), 10, what="the executor saying so")
    job_id = client.submit({"name": "two", "command": "true", "resources": {"gpus": 2, **SMALL}}).job_id
    wait_for(lambda: client.job(job_id).pending, 20, what="the job waiting")
    assert not slurm_jobs(slurm_cluster, job_id)
    slurm_cluster.run("scancel", outside)
    assert slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=30).state == "succeeded"


def test_a_job_over_its_memory_is_killed_by_slurm_as_oom_killed(slurm_platform):
    client = slurm_platform.client()
    hog = "import time; b = b'x' * (300 << 20); print('allocated', flush=True); time.sleep(60)"
    spec = {"name": "hog", "command": ["python3", "-c", hog], "resources": {"cpus": 1, "memory": "100MiB"}}
    job_id = client.submit(spec).job_id
    job = slurm_platform.wait_state(job_id, {"succeeded", "failed"}, timeout=60)
    assert (job.state, job.attempts[-1].failure) == ("failed", "oom_killed"), job.attempts[-1]
    assert "exceeded its memory limit" in job.attempts[-1].message, job.attempts[-1]


def test_a_job_cancelled_while_its_batch_job_waits_in_slurm_never_runs(
    slurm_platform, slurm_cluster, tmp_path
):
    client = slurm_platform.client()
    every_cpu = slurm_cluster.sbatch(
        f"--cpus-per-task={CPUS}", "--mem=64M", "-o", "/dev/null", "--wrap", "sleep 120"
    )
    try:
        wait_for(
            lambda: "RUNNING" in slurm_cluster.run("squeue", "-h", "-j", every_cpu, "-o", "%T").stdout, 30
        )
        ran = tmp_path / "ran"
        job_id = client.submit({"name": "waits", "command": f"touch {ran}", "resources": SMALL}).job_id
        wait_for(
            lambda: any(line.endswith("|PENDING") for line in slurm_jobs(slurm_cluster, job_id)),
            30,
            what="its batch job waiting in Slurm for a CPU",
        )
        client.cancel(job_id)
        assert slurm_platform.wait_state(job_id, {"cancelled"}, timeout=30).state == "cancelled"
        wait_for(
            lambda: all(line.endswith("|CANCELLED") for line in slurm_jobs(slurm_cluster, job_id)),
            30,
            what="its batch job cancelled in Slurm, not left to start later",
        )
        assert not ran.exists()
    finally:
        slurm_cluster.run("scancel", every_cpu)
