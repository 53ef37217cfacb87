"""Checkpoints that survive a preemption, through `gpuyard up` (real NATS, real processes): a job saves with
`gpuyard.checkpoint`, a job of higher priority preempts it (SIGTERM, on which it saves once more and exits), its
next attempt finds the same GPUYARD_CHECKPOINT_DIR and resumes from `load_latest`, so that the steps done over both
attempts are at most the target and one checkpoint interval; each save is reported (`job.checkpointed`, the job's
`checkpoint`, `gpuyard describe`), the preemption says the work it lost (`lost_work_seconds`, `gpuyard events`),
and what the job wrote to GPUYARD_OUTPUT_DIR is still there after it ends, listed and downloaded through the API
(`gpuyard artifacts`)."""

from __future__ import annotations

from datetime import datetime

import pytest

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration

TARGET, EVERY = 100, 10
TRAIN = f"""
import os, signal, sys, time
from gpuyard import checkpoint

TARGET, EVERY = {TARGET}, {EVERY}
stopping = False
signal.signal(signal.SIGTERM, lambda *_: globals().update(stopping=True))
found = checkpoint.load_latest()
start = found[0] + 1 if found else 0
print("attempt", os.environ["GPUYARD_ATTEMPT"], "in", os.environ["GPUYARD_CHECKPOINT_DIR"], "from", start, flush=True)
done = os.path.join(os.environ["GPUYARD_OUTPUT_DIR"], "steps")
for step in range(start, TARGET):
    time.sleep(0.2)  # one step of training
    with open(done, "a") as f:
        f.write(f"{{step}}\\n")
    if step % EVERY == 0 or step == TARGET - 1 or stopping:
        checkpoint.save(f"after step {{step}}".encode(), step)
    if stopping:
        print("preempted after step", step, flush=True)
        sys.exit(0)
with open(os.path.join(os.environ["GPUYARD_OUTPUT_DIR"], "result"), "w") as f:
    f.write("trained\\n")
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("checkpoints")
    env = {"GPUYARD_MIN_RUNTIME_BEFORE_PREEMPTION": "0", "GPUYARD_PREEMPTION_GRACE": "20"}
    p = Platform(base / "data", base / "config", simulate_gpus=2, executors=1, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def events(client, job_id: str, kind: str) -> list[dict]:
    return [e.event["data"] for e in client.events(job_id) if e.event["type"] == f"io.gpuyard.job.{kind}"]


def test_a_preempted_job_resumes_from_its_latest_checkpoint(platform, tmp_path):
    client = platform.client()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    resources = {"gpus": 2, "cpus": 0.1, "memory": "200MB"}
    low = client.submit(
        {"name": "resumable", "command": ["python", str(script)], "resources": resources, "priority": "low"}
    ).job_id
    wait_for(
        lambda: (c := client.job(low).checkpoint) is not None and c.step >= 2 * EVERY,
        60,
        0.1,
        "two checkpoints of the first attempt reported",
    )
    urgent = client.submit(
        {"name": "urgent", "command": "sleep 2", "resources": resources, "priority": "critical"}
    ).job_id
    wait_for(lambda: events(client, low, "requeued"), 60, 0.2, "the low job preempted and requeued")
    assert platform.wait_state(urgent, {"succeeded"}, timeout=60).state == "succeeded"
    job = platform.wait_state(low, {"succeeded", "failed"}, timeout=120)
    assert job.state == "succeeded", job.message
    assert [a.summary for a in job.attempts] == ["preempted: priority", "succeeded"]

    first, second = client.logs(low, attempt=1), client.logs(low, attempt=2)
    folder = platform.data_dir / "storage" / "checkpoints" / job.tenant / low
    assert f"attempt 1 in {folder} from 0" in first and "preempted after step" in first, first
    resumed_from = int(second.split(" from ", 1)[1].split()[0])
    assert f"attempt 2 in {folder} from " in second and resumed_from > 2 * EVERY, second

    outputs = platform.data_dir / "storage" / "outputs" / job.tenant / low
    steps = [int(line) for line in (outputs / "steps").read_text().split()]
    assert sorted(set(steps)) == list(range(TARGET))  # every step done, across the two attempts
    assert len(steps) <= TARGET + EVERY, len(steps)  # none done again beyond one checkpoint interval
    assert (outputs / "result").read_text() == "trained\n"  # kept after the job's end

    assert (job.checkpoint.step, job.checkpoint.attempt) == (TARGET - 1, 2)
    reported = events(client, low, "checkpointed")
    assert {r["attempt"] for r in reported} == {1, 2} and reported[-1]["step"] == TARGET - 1
    assert len(list(folder.iterdir())) == 3  # the last three kept
    described = platform.cli("describe", low)
    assert described.returncode == 0, described.stderr
    assert f"step {TARGET - 1} ·" in described.stdout and "by attempt 2" in described.stdout, described.stdout

    # the preemption said the work it lost: since the latest checkpoint the scheduler knew, within the run
    [(at, preempted)] = [
        (e.event["time"], e.event["data"])
        for e in client.events(low)
        if e.event["type"].endswith(".preempted")
    ]
    ran = (datetime.fromisoformat(at) - job.attempts[0].started_at).total_seconds()
    assert 0 < preempted["lost_work_seconds"] < ran, (preempted, ran)
    listed = platform.cli("events", low)
    assert listed.returncode == 0 and " of work" in listed.stdout, listed.stdout

    # what it kept, through the API: listed, downloaded whole (unpacked into a folder) and a file alone
    kept = platform.cli("artifacts", low)
    assert kept.returncode == 0, kept.stderr
    assert [line.split()[0] for line in kept.stdout.splitlines()[1:-1]] == ["result", "steps"], kept.stdout
    fetched = platform.cli("artifacts", low, "--download", "-o", str(tmp_path / "kept"))
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["result", "steps"]
    assert (tmp_path / "kept" / "result").read_text() == "trained\n"
    assert (tmp_path / "kept" / "steps").read_text() == (outputs / "steps").read_text()
    one = platform.cli("artifacts", low[:8], "--download", "result", "-o", str(tmp_path / "result"))
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "result").read_text() == "trained\n"
