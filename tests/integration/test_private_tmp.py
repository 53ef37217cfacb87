"""Tenants do not see each other's /tmp nor processes, through `gpuyard up` as root: a job of one tenant finds
its /tmp empty and cannot read what another tenant's job wrote in its own, nor that job's command line in
/proc; its job.started says so. Needs root (as CI runs) and a node that allows mount namespaces."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from .conftest import Platform, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="a mount namespace per job needs a root platform (as in CI)"
    ),
]


def started(client, job_id: str) -> dict:
    return next(e.event["data"] for e in client.events(job_id) if e.event["type"].endswith(".job.started"))


def test_a_tenants_job_finds_its_own_tmp_empty_and_nothing_of_another_tenants(tmp_path):
    job_root = Path(tempfile.mkdtemp(prefix="gpuyard-test-jobs-", dir="/var/lib"))  # (not under /tmp)
    job_root.chmod(0o711)
    p = Platform(
        tmp_path / "data",
        tmp_path / "config",
        env={"GPUYARD_JOB_USERS": "", "GPUYARD_JOB_ROOT": str(job_root / "jobs")},
        executors=1,
    ).start()
    try:
        client = p.client()
        name = f"notes-{uuid.uuid4().hex[:8]}"
        victim = client.submit(
            {
                "tenant": "vision",
                "command": f"echo secret > /tmp/{name}; echo $$ > pid; exec sleep 120",
                "resources": {"gpus": 1},
            }
        ).job_id
        p.wait_state(victim, {"running"})
        isolation = started(client, victim)["isolation"]
        if not isolation.startswith("private /tmp"):
            pytest.skip(f"no private /tmp on this node: {isolation}")
        work = job_root / "jobs" / victim / "attempt-1" / "work-0"
        pid = int(wait_for(lambda: (work / "pid").exists() and (work / "pid").read_text().strip(), 10))
        snoop = (
            f"find /tmp /var/tmp /dev/shm -mindepth 1 | wc -l; echo TMPDIR=$TMPDIR; "
            f"cat /tmp/{name} || echo no-notes; cat {job_root}/jobs/{victim}/attempt-1/tmp/{name} || echo no-way; "
            f"cat /proc/{pid}/cmdline || echo no-cmdline"
        )
        attacker = client.submit({"tenant": "nlp", "command": snoop, "resources": {"gpus": 1}}).job_id
        done = p.wait_state(attacker, {"succeeded", "failed"}, timeout=30)
        output = client.logs(attacker)
        assert done.state == "succeeded", output
        lines = output.splitlines()
        assert lines[:2] == ["0", "TMPDIR=/tmp"], output
        assert {"no-notes", "no-way"} <= set(lines) and "secret" not in output, output
        if "its user's processes only" in isolation:
            assert "no-cmdline" in lines and "sleep" not in output, output
        assert (job_root / "jobs" / victim / "attempt-1" / "tmp" / name).read_text() == "secret\n"
        client.cancel(victim)
        p.wait_state(victim, {"cancelled"}, timeout=30)
        wait_for(lambda: not (job_root / "jobs" / victim / "attempt-1" / "tmp").exists(), 10)
    finally:
        p.stop()
        shutil.rmtree(job_root, ignore_errors=True)
