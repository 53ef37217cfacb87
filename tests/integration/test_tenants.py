"""Jobs without the platform's rights, through `gpuyard up` as root: each tenant's jobs run
as an unprivileged user of its own; they cannot read the tokens, the event store or another tenant's working
directory, nor signal another tenant's job. Needs root (as CI runs): skipped otherwise."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from .conftest import Platform, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="running jobs as other users needs a root platform (as in CI)"
    ),
]


def test_a_tenants_job_reads_no_secret_and_cannot_touch_another_tenants_job(tmp_path):
    job_root = Path(tempfile.mkdtemp(prefix="gpuyard-jobs-", dir="/tmp"))
    job_root.chmod(0o711)  # (pytest's own folders are 0700: no job user could pass through them)
    p = Platform(
        tmp_path / "data",
        tmp_path / "config",
        env={"GPUYARD_JOB_USERS": "", "GPUYARD_JOB_ROOT": str(job_root / "jobs")},
        executors=1,
    ).start()
    try:
        client = p.client()
        data = p.data_dir
        victim = client.submit(
            {
                "tenant": "vision",
                "command": "echo secret > notes; echo $$ > pid; sleep 120",
                "resources": {"gpus": 1},
            }
        ).job_id
        p.wait_state(victim, {"running"})
        work = job_root / "jobs" / victim / "attempt-1" / "work-0"
        pid = int(wait_for(lambda: (work / "pid").exists() and (work / "pid").read_text().strip(), 10))
        snoop = (
            f"id -u; cat {data}/tokens.json || echo no-tokens; cat {data}/events.db >/dev/null || echo no-events; "
            f"cat {data}/jobs/{victim}/attempt-1/replica-0.log || echo no-log; cat {work}/notes || echo no-notes; "
            f"kill -9 {pid} || echo no-kill"
        )
        attacker = client.submit({"tenant": "nlp", "command": snoop, "resources": {"gpus": 1}}).job_id
        done = p.wait_state(attacker, {"succeeded", "failed"}, timeout=30)
        output = client.logs(attacker)
        assert done.state == "succeeded", output
        lines = output.splitlines()
        assert int(lines[0]) >= 2_000_000  # a user of its own, not root
        assert {"no-tokens", "no-events", "no-log", "no-notes", "no-kill"} <= set(lines), output
        assert "secret" not in output and "sha256" not in output
        assert client.job(victim).state == "running"
        client.cancel(victim)
        p.wait_state(victim, {"cancelled"}, timeout=30)
    finally:
        p.stop()
        shutil.rmtree(job_root, ignore_errors=True)
