"""The Slurm backend under faults, each test on a platform of its own: an executor killed while its Slurm jobs run
and end adopts them (no second copy, no lost exit); a Slurm node set DOWN mid-job requeues the job as node_lost,
and the job runs again once the node is back."""

from __future__ import annotations

import os
import signal

import pytest

from ..conftest import wait_for
from ..test_restart import executor_processes
from .conftest import start_platform
from .test_slurm_backend import SMALL, slurm_jobs

pytestmark = pytest.mark.integration


def test_an_executor_killed_while_slurm_jobs_run_adopts_them(slurm_cluster, tmp_path):
    p = start_platform(slurm_cluster, tmp_path)
    try:
        client = p.client()
        marks, short_go, long_go = tmp_path / "marks", tmp_path / "short-go", tmp_path / "long-go"
        marks.mkdir()

        def job(name: str, go, code: int) -> str:
            command = f"echo $GPUYARD_ATTEMPT >> {marks}/{name}; while [ ! -e {go} ]; do sleep 0.1; done; exit {code}"
            return client.submit({"name": name, "command": command, "resources": {"gpus": 1, **SMALL}}).job_id

        short, long = job("short", short_go, 3), job("long", long_go, 0)
        for job_id in (short, long):
            p.wait_state(job_id, {"running"}, timeout=30)
        [executor] = executor_processes(p.proc.pid)
        os.kill(p.proc.pid, signal.SIGSTOP)  # `gpuyard up` held: it restarts no executor until it goes on
        try:
            os.kill(executor, signal.SIGKILL)
            short_go.touch()  # the short job ends while no executor runs
            wait_for(
                lambda: any("FAILED" in line for line in slurm_jobs(slurm_cluster, short)), 30, what="its end"
            )
        finally:
            os.kill(p.proc.pid, signal.SIGCONT)
        done = p.wait_state(short, {"succeeded", "failed"}, timeout=60)
        assert (done.state, done.attempt, done.attempts[-1].exit_code) == ("failed", 1, 3), done
        assert client.job(long).state == "running"  # adopted, not requeued
        long_go.touch()
        assert p.wait_state(long, {"succeeded", "failed"}, timeout=60).state == "succeeded"
        for job_id, name in ((short, "short"), (long, "long")):
            kinds = [e.event["type"].rsplit(".", 1)[1] for e in client.events(job_id)]
            assert kinds.count("started") == 1 and "requeued" not in kinds, kinds
            assert (marks / name).read_text() == "1\n"  # its command ran exactly once
            assert len(slurm_jobs(slurm_cluster, job_id)) == 1  # one batch job: no second copy
    finally:
        p.stop()
        slurm_cluster.cancel_all()


def test_a_slurm_node_set_down_mid_job_requeues_it_as_node_lost(slurm_cluster, tmp_path):
    p = start_platform(slurm_cluster, tmp_path)
    node = slurm_cluster.node
    try:
        client = p.client()
        command = 'echo "attempt $GPUYARD_ATTEMPT"; [ "$GPUYARD_ATTEMPT" -gt 1 ] || sleep 120'
        spec = {"name": "downed", "command": command, "max_retries": 0, "resources": {"gpus": 1, **SMALL}}
        job_id = client.submit(spec).job_id
        p.wait_state(job_id, {"running"}, timeout=30)
        slurm_cluster.scontrol("update", f"nodename={node}", "state=down", "reason=gpuyard-test")
        job = wait_for(lambda: (j := client.job(job_id)).attempt >= 2 and j, 30, what="the job requeued")
        assert "node_lost" in (job.attempts[0].requeue or "") or "node" in (job.attempts[0].summary or ""), (
            job
        )
        first = [line for line in slurm_jobs(slurm_cluster, job_id) if "-a1-" in line]
        assert first and first[0].endswith("|NODE_FAIL"), first
        now = client.job(job_id)
        assert now.state in ("queued", "pending"), (
            now.attempts,
            client.request("GET", "/v1/nodes"),
        )  # a DOWN node is not placed on
        slurm_cluster.scontrol("update", f"nodename={node}", "state=resume")
        assert p.wait_state(job_id, {"succeeded", "failed"}, timeout=60).state == "succeeded"
    finally:
        if slurm_cluster.node_state().startswith("down"):
            slurm_cluster.scontrol("update", f"nodename={node}", "state=resume")
        p.stop()
        slurm_cluster.cancel_all()
