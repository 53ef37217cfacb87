"""The executor in the whole platform (`gpuyard up`, real NATS, real processes): timeout, preemption with
grace, retries, logs followed across rotations, an executor killed mid-job, two executors announcing two
nodes, and the 2-worker distributed training example."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.services.executor.announce import default_address
from gpuyard.shared.contracts.events.jobs import JobPreempted
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.runtime.paths import log_files, log_path
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LOG_MAX_BYTES = 4096


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """One platform for this module, with small numbers: fast retries, short grace, small log files."""
    base = tmp_path_factory.mktemp("executor")
    p = Platform(base / "data", base / "config")
    p.env.update(
        GPUYARD_RETRY_BACKOFF="0.2",
        GPUYARD_GRACE_SECONDS="3",
        GPUYARD_LOG_MAX_BYTES=str(LOG_MAX_BYTES),
        GPUYARD_LOG_BACKUPS="100",
        GPUYARD_HEARTBEAT_INTERVAL="1",
    )
    p.start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def events(client, job_id: str) -> list[dict]:
    return [e.event for e in client.events(job_id)]


def kinds(client, job_id: str) -> list[str]:
    return [e["type"].removeprefix("io.gpuyard.job.") for e in events(client, job_id)]


def seconds(event: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["time"]).timestamp()


def test_a_job_past_its_timeout_is_stopped_and_fails_with_timeout(platform):
    client = platform.client()
    job_id = client.submit({"command": "echo working; sleep 60", "timeout": 1}).job_id
    job = platform.wait_state(job_id, {"failed"}, timeout=30)
    assert job.failure.reason == "timeout"
    assert job.message == "replica 0: timed out after 1s and was stopped"
    started, exited = (e for e in events(client, job_id) if e["type"].endswith(("started", "replica_exited")))
    assert seconds(exited) - seconds(started) >= 1  # not stopped before its time limit


def test_preemption_gives_the_grace_then_sigkill_and_requeues(platform, tmp_path):
    client = platform.client()
    marker, trapped = tmp_path / "got-term", tmp_path / "trap-set"
    command = (
        f'trap \'echo "$GPUYARD_ATTEMPT" >> {marker}\' TERM; echo "$GPUYARD_ATTEMPT" >> {trapped}; '
        "while true; do sleep 0.1; done"  # ignores SIGTERM (after noting it): only SIGKILL ends it
    )
    job_id = client.submit({"command": command, "resources": {"gpus": 1}}).job_id
    platform.wait_state(job_id, {"running"})
    wait_for(lambda: trapped.exists() and trapped.read_text() == "1\n", 10, what="the shell's trap")

    async def preempt():
        bus = await platform.bus("scheduler")
        store = await open_store(f"sqlite:///{platform.data_dir / 'events.db'}")
        try:
            ledger = JobLedger(store, bus, "/test")
            data = JobPreempted(job_id=job_id, attempt=1, cause=PreemptionCause.PRIORITY, grace_seconds=2)
            return (await ledger.append(job_id, data)).applied
        finally:
            await store.close()
            await bus.close()

    assert asyncio.run(preempt())
    wait_for(lambda: "requeued" in kinds(client, job_id), 30, what="the requeue")
    history = events(client, job_id)
    preempted = next(e for e in history if e["type"].endswith("preempted"))
    exited = next(e for e in history if e["type"].endswith("replica_exited"))
    requeued = next(e for e in history if e["type"].endswith("requeued"))
    assert marker.read_text().splitlines()[0] == "1"  # SIGTERM reached the job at once
    assert seconds(exited) - seconds(preempted) >= 2  # the grace was honoured
    assert exited["data"]["signal"] == signal.SIGKILL  # then SIGKILL
    assert requeued["data"]["reason"] == "preempted" and requeued["data"]["attempt"] == 2
    job = platform.wait_state(job_id, {"running"})  # placed again as attempt 2
    assert job.attempt == 2
    client.cancel(job_id)
    platform.wait_state(job_id, {"cancelled"}, timeout=30)


def test_a_failing_job_is_retried_with_backoff_and_every_attempt_is_visible(platform):
    client = platform.client()
    spec = {"command": 'echo "attempt $GPUYARD_ATTEMPT"; exit 5', "max_retries": 2}
    job_id = client.submit(spec).job_id
    job = platform.wait_state(job_id, {"failed"}, timeout=60)
    assert job.attempt == 3 and job.failure.exit_code == 5
    assert [a.summary for a in job.attempts] == [
        "requeued: retry",
        "requeued: retry",
        "failed: exit_code",
    ]
    requeues = [e["data"] for e in events(client, job_id) if e["type"].endswith("requeued")]
    assert [(r["attempt"], r["reason"], r["exit_code"]) for r in requeues] == [
        (2, "retry", 5),
        (3, "retry", 5),
    ]
    assert requeues[0]["message"] == "retry 1/2 after: exited with code 5"
    assert kinds(client, job_id).count("started") == 3
    for attempt in (1, 2, 3):
        assert client.logs(job_id, attempt=attempt) == f"attempt {attempt}\n"


def test_logs_follow_a_running_job_across_rotations(platform):
    client = platform.client()
    command = 'for i in $(seq 1 400); do echo "line $i of the log, padded to be long enough: ......."; sleep 0.005; done'
    job_id = client.submit({"command": command}).job_id
    follow = platform.cli("logs", job_id, "-f", timeout=60)
    assert follow.returncode == 0, follow.stderr
    numbers = [int(line.split()[1]) for line in follow.stdout.splitlines()]
    assert numbers == list(range(1, 401))
    files = log_files(log_path(platform.data_dir, job_id, 1, 0))
    assert len(files) > 3 and all(f.stat().st_size <= LOG_MAX_BYTES for f in files)  # it was rotated
    assert client.logs(job_id) == follow.stdout  # and the whole log reads the same afterwards
    assert client.logs(job_id, tail=2).splitlines()[-1].startswith("line 400 ")


def executor_pids(client) -> list[int]:
    return [s.pid for s in client.services() if s.service == "executor"]


def test_an_executor_killed_mid_job_comes_back_and_adopts_the_job_which_runs_on_untouched(platform, tmp_path):
    client = platform.client()
    starts, pidfile = tmp_path / "starts", tmp_path / "pid"
    command = f'echo "$GPUYARD_ATTEMPT" >> {starts}; echo $$ > {pidfile}; exec sleep 300'
    job_id = client.submit({"command": command, "resources": {"gpus": 1}}).job_id
    platform.wait_state(job_id, {"running"})
    first = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="the job's pid"))
    before = set(
        wait_for(
            lambda: len(executor_pids(client)) == platform.executors and executor_pids(client),
            15,
            what="every executor process's heartbeat",
        )
    )
    started = next(e for e in events(client, job_id) if e["type"].endswith(".started"))
    executor = int(started["source"].rsplit("-", 1)[1])  # the executor process that runs the job
    assert executor in before

    os.kill(executor, signal.SIGKILL)  # that executor only; `gpuyard up` restarts it
    [successor] = wait_for(
        lambda: set(executor_pids(client)) - before, 30, what="a new executor process in its place"
    )
    job = client.job(job_id)  # (it has reconciled, adopting the job, before it announces itself)
    assert (job.state, job.attempt) == ("running", 1) and Path(f"/proc/{first}").exists()
    client.cancel(job_id)  # and the new executor can stop it
    job = platform.wait_state(job_id, {"cancelled"}, timeout=30)
    wait_for(lambda: not Path(f"/proc/{first}").exists(), 10, what="the job's process to be stopped")
    # the end of the job, which the new executor recorded, comes after anything it did on adopting it: the
    # history up to there shows the one attempt, started once and never requeued, and the same process
    assert job.attempt == 1 and kinds(client, job_id) == [
        "submitted",
        "placed",
        "started",
        "cancel_requested",
        "replica_exited",
        "cancelled",
    ]
    exited = next(e for e in events(client, job_id) if e["type"].endswith("replica_exited"))
    assert int(exited["source"].rsplit("-", 1)[1]) == successor  # the adopting executor saw it end
    assert exited["data"]["signal"] == signal.SIGTERM and starts.read_text().splitlines() == ["1"]


def test_two_executors_announce_two_nodes_and_a_gang_spans_both(platform, tmp_path):
    client = platform.client()
    env = {
        **platform.joining_env("executor"),
        "GPUYARD_NODE_NAME": "node-b",
        "GPUYARD_SIMULATE_GPUS": "2",
    }
    log = (tmp_path / "node-b.log").open("wb")
    second = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.services.executor"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        nodes = wait_for(
            lambda: {n.node for n in client.nodes() if n.gpus} >= {"node-a", "node-b"} and client.nodes(),
            30,
            what="node-b to join",
        )
        assert {n.node: len(n.gpus) for n in nodes} == {"node-a": 2, "node-b": 2}
        command = 'echo "rank $RANK of $WORLD_SIZE on $GPUYARD_NODE master $MASTER_ADDR:$MASTER_PORT"'
        job_id = client.submit({"command": command, "replicas": 2, "resources": {"gpus": 2}}).job_id
        job = platform.wait_state(job_id, {"succeeded"}, timeout=60)
        assert sorted(p.node for p in job.placements) == ["node-a", "node-b"]
        started = {e["data"]["node"] for e in events(client, job_id) if e["type"].endswith("started")}
        assert started == {"node-a", "node-b"}
        lines = {}
        for placement in job.placements:
            words = client.logs(job_id, replica=placement.replica).split()
            assert words[:4] == ["rank", str(placement.replica), "of", "2"]
            assert words[5] == placement.node
            lines[placement.replica] = words[7]
        master_node = next(p.node for p in job.placements if p.replica == 0)
        assert lines[0] == lines[1]  # both replicas were told the same rendezvous
        assert lines[0].rsplit(":", 1)[0] == default_address() != master_node  # an address, not a node name
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        log.close()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed (pip install -e '.[train]'): the distributed example needs it",
)
def test_the_distributed_example_trains_with_two_cpu_workers_that_agree(platform):
    """As the README and the example type it: `gpuyard submit examples/ddp-cpu.yaml --follow`, in the checkout
    `gpuyard up` was started in; its `python` is the platform's (with PyTorch), whatever the PATH says."""
    path = ":".join(p for p in os.environ["PATH"].split(":") if p != str(Path(sys.executable).parent))
    env = {**platform.env, "PATH": path}  # the venv is not on the PATH, as after `make demo`
    run = subprocess.run(
        [str(Path(sys.executable).parent / "gpuyard"), "submit", "examples/ddp-cpu.yaml", "--follow"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.split("submitted job ")[1].split()[0]
    client = platform.client()
    job = client.job(job_id)
    logs = [client.logs(job_id, replica=r) for r in (0, 1)]
    assert job.state == "succeeded", logs
    finals = [next(line for line in text.splitlines() if line.startswith("final: ")) for text in logs]
    assert finals[0] == finals[1]  # the same all-reduced loss and the same weights on both ranks
    assert "rank 0/2 up on cpu" in logs[0] and "rank 1/2 up on cpu" in logs[1]
    loss = float(finals[0].split("mean loss ")[1].split()[0])
    assert loss < 0.01  # it learned y = 3·x0 − 2·x1 + 0.5
