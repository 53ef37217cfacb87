"""The whole platform as users run it: `gpuyard up` (real NATS, five real processes), the CLI and the API."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import pytest

from gpuyard.shared.contracts.events.envelope import CloudEvent, subject_of
from gpuyard.shared.contracts.events.jobs import FailureReason
from gpuyard.shared.contracts.events.subjects import Subject, subject_filter
from gpuyard.shared.contracts.jobstate import JobState

from .conftest import sse_events, wait_for
from .witness import acknowledged

pytestmark = pytest.mark.integration
PLACEMENTS_DURABLE = "executor-node-a"
"""The durable consumer of placements that node-a's executor processes share."""


def write_spec(tmp_path, name: str, spec: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def event_types(client, job_id: str) -> list[str]:
    return [
        CloudEvent.model_validate(e.event).nats_subject.value.split(".", 1)[1] for e in client.events(job_id)
    ]


def test_a_job_goes_submitted_placed_running_succeeded(platform, tmp_path):
    spec = write_spec(
        tmp_path, "ok", {"name": "ok", "command": "echo hello $GPUYARD_JOB_ID", "resources": {"gpus": 1}}
    )
    result = platform.cli("submit", spec, "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    client = platform.client()
    job = client.job(job_id)
    assert job.state == JobState.SUCCEEDED and job.failure is None
    assert event_types(client, job_id) == ["submitted", "placed", "started", "replica_exited", "succeeded"]
    assert f"hello {job_id}" in client.logs(job_id)
    assert job.placements[0].node == "node-a" and len(job.placements[0].gpus) == 1


def test_follow_prints_each_replicas_output_prefixed_and_every_event_to_the_end(platform, tmp_path):
    job = {"command": 'echo "line one of $RANK"; echo "line two of $RANK"', "replicas": 2}
    result = platform.cli("submit", write_spec(tmp_path, "two", job), "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        assert f"r{rank} | line one of {rank}" in lines and f"r{rank} | line two of {rank}" in lines
        assert lines.index(f"r{rank} | line one of {rank}") < lines.index(f"r{rank} | line two of {rank}")
    assert sum("succeeded" in line for line in lines) == 2  # the event, and the closing line
    quiet = platform.cli("submit", write_spec(tmp_path, "quiet", job), "--follow", "--no-logs")
    assert quiet.returncode == 0 and "line one" not in quiet.stdout and "succeeded" in quiet.stdout


def test_a_failing_job_fails_and_keeps_its_exit_code(platform, tmp_path):
    spec = write_spec(tmp_path, "bad", {"command": "echo about to fail; exit 3"})
    result = platform.cli("submit", spec, "--follow")
    assert result.returncode == 1
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = platform.client().job(job_id)
    assert job.state == JobState.FAILED
    assert (job.failure.reason, job.failure.exit_code, job.failure.replica) == (FailureReason.EXIT_CODE, 3, 0)
    described = platform.cli("describe", job_id[:8])  # a unique prefix names the job, as in git and docker
    assert "exit_code: " in described.stdout and "exit code 3 · replica 0" in described.stdout
    assert "Last log lines of replica 0:" in described.stdout and "  about to fail" in described.stdout


def test_a_command_that_does_not_exist_fails_with_that_reason(platform):
    client = platform.client()
    job_id = client.submit({"command": ["/no/such/program"]}).job_id
    job = platform.wait_state(job_id, {"failed"})
    assert job.failure.reason == FailureReason.COMMAND_NOT_FOUND and "/no/such/program" in job.failure.message


def test_cancel_stops_a_running_job(platform, tmp_path):
    client = platform.client()
    pidfile = tmp_path / "pid"
    job_id = client.submit(
        {"command": f"echo $$ > {pidfile}; exec sleep 300", "resources": {"gpus": 1}}
    ).job_id
    platform.wait_state(job_id, {"running"})
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="pid file"))
    result = platform.cli("cancel", job_id)
    assert result.returncode == 0 and "cancel requested" in result.stdout
    job = platform.wait_state(job_id, {"cancelled"})
    assert job.state == JobState.CANCELLED
    assert event_types(client, job_id)[-2:] == ["replica_exited", "cancelled"]
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, what="the job's process to be gone")
    again = platform.cli("cancel", job_id)
    assert again.returncode == 1 and "already cancelled" in again.stderr


def test_two_replicas_get_torchrun_style_environment(platform):
    client = platform.client()
    command = "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT"
    job_id = client.submit({"command": command, "replicas": 2, "resources": {"gpus": 1}}).job_id
    platform.wait_state(job_id, {"succeeded"})
    logs = [client.logs(job_id, replica=r) for r in (0, 1)]
    assert logs[0].startswith("rank=0 world=2 local=0/2 master=127.0.0.1:")
    assert logs[1].startswith("rank=1 world=2 local=1/2 master=127.0.0.1:")
    assert logs[0].split("master=")[1] == logs[1].split("master=")[1]


def test_a_job_no_node_could_hold_is_refused_with_the_largest_node(platform, tmp_path):
    spec = write_spec(tmp_path, "too-big", {"name": "too-big", "command": "true", "resources": {"gpus": 4}})
    refused = platform.cli("submit", spec)
    assert refused.returncode == 1 and "submitted job" not in refused.stdout
    assert (
        "no node could ever hold this job: needs 4 GPUs on one node; the largest node has 2 (node-a)"
        in refused.stderr
    ), refused.stderr
    assert "too-big" not in platform.cli("ps", "--all").stdout


def test_redelivered_and_duplicate_events_change_nothing(platform, tmp_path):
    client = platform.client()
    job_id = client.submit({"command": "echo ran-once", "resources": {"gpus": 1}}).job_id
    platform.wait_state(job_id, {"succeeded"})
    before = client.events(job_id)
    placed = CloudEvent.model_validate(next(e.event for e in before if e.event["type"].endswith("placed")))
    tenant = client.job(job_id).tenant

    async def republish():
        bus = await platform.bus("scheduler")
        try:
            duplicate = await bus.publish(placed, tenant=tenant)  # same Nats-Msg-Id: dropped by JetStream
            # a redelivery that got past de-duplication: same event, other message id
            redelivered = await bus.js.publish(
                subject_of(placed, tenant), placed.to_json(), headers={"Nats-Msg-Id": "redelivery-1"}
            )
            # the node's executors have handled it: whatever they would do about it is done
            await acknowledged(bus, [PLACEMENTS_DURABLE], redelivered.seq)
            return duplicate
        finally:
            await bus.close()

    assert asyncio.run(republish()).duplicate
    assert client.events(job_id) == before
    assert client.logs(job_id).count("ran-once") == 1


def test_the_nodes_executor_processes_share_its_jobs_and_start_each_once(platform):
    client = platform.client()
    small = {"gpus": 0.25, "cpus": 0.1, "memory": "10MB"}
    jobs = [client.submit({"command": "echo once", "resources": small}).job_id for _ in range(16)]
    for job_id in jobs:
        platform.wait_state(job_id, {"succeeded"})
    starters = []
    for job_id in jobs:
        started = [e.event for e in client.events(job_id) if e.event["type"].endswith(".started")]
        assert len(started) == 1 and client.logs(job_id).count("once") == 1
        starters.append(started[0]["source"])
    assert len(set(starters)) == platform.executors == 2  # both executor processes ran some of them


def test_bad_input_gets_one_clear_line_not_a_traceback(platform, tmp_path):
    bad = write_spec(tmp_path, "bad-spec", {"command": "true", "resources": {"gpus": 1.5}})
    result = platform.cli("submit", bad)
    assert result.returncode == 1 and "resources.gpus" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    missing = platform.cli("submit", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    token = platform.cli("ps", "--token", "wrong")
    assert token.returncode == 1 and "not authorised" in token.stderr and "Traceback" not in token.stderr
    unknown = platform.cli("describe", "no-such-job")
    assert unknown.returncode == 1 and "no job" in unknown.stderr


def test_the_event_stream_serves_a_jobs_events_as_sse(platform):
    client = platform.client()
    token = client.token

    got: list[dict] = []
    connected = threading.Event()

    def listen():
        got.extend(sse_events(platform.server, token, {"subject": "job.>"}, count=5, connected=connected))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert connected.wait(10), "the stream never said it was connected"  # subscribed: nothing is missed
    job_id = client.submit({"command": "true", "resources": {"gpus": 1}}).job_id
    listener.join(20)
    mine = [e for e in got if e["subject"] == job_id]
    assert [e["type"] for e in mine][:3] == [
        "io.gpuyard.job.submitted",
        "io.gpuyard.job.placed",
        "io.gpuyard.job.started",
    ]


def test_the_event_stream_of_a_tenant_carries_none_of_another_tenants_events(platform):
    admin = platform.client()
    vision = admin.create_token(tenant="vision", user="ana").token
    got: list[dict] = []
    connected = threading.Event()

    def listen():
        got.extend(sse_events(platform.server, vision, {"subject": "job.>"}, count=3, connected=connected))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert connected.wait(10), "the stream never said it was connected"
    theirs = admin.submit({"tenant": "nlp", "command": "true", "resources": {"gpus": 1}}).job_id
    platform.wait_state(theirs, {"succeeded"})  # every event of nlp's job was published before vision's job
    mine = admin.submit({"tenant": "vision", "command": "true", "resources": {"gpus": 1}}).job_id
    listener.join(20)
    assert {e["subject"] for e in got} == {mine}, [(e["subject"], e["type"]) for e in got]


def test_a_crashed_service_is_restarted_and_the_platform_keeps_working(platform):
    client = platform.client()
    scheduler = wait_for(
        lambda: next((s for s in client.services() if s.service == "scheduler"), None),
        15,
        what="the scheduler's heartbeat",
    )
    os.kill(scheduler.pid, signal.SIGKILL)
    wait_for(lambda: "scheduler" in platform.log.read_text() and "restarting" in platform.log.read_text(), 10)
    job_id = client.submit({"command": "true", "resources": {"gpus": 1}}).job_id
    assert platform.wait_state(job_id, {"succeeded"}, timeout=40).state == JobState.SUCCEEDED


POISONED = subject_filter(Subject.JOB_PLACED, "vision")  # job.placed.vision: what the executors consume


def test_a_poison_event_shows_up_in_the_dead_letters(platform):
    async def poison():
        bus = await platform.bus("scheduler")
        try:
            await bus.nc.publish(POISONED, b'{"not": "a cloudevent"}')
            await bus.nc.flush()
        finally:
            await bus.close()

    asyncio.run(poison())
    client = platform.client()
    letters = wait_for(lambda: client.dead_letters(), 15, what="a dead letter")
    assert letters[0].original_subject == POISONED and "unreadable event" in letters[0].error
    assert letters[0].event == {"not": "a cloudevent"}
    job_id = client.submit({"command": "true", "resources": {"gpus": 1}}).job_id  # nothing blocked
    assert platform.wait_state(job_id, {"succeeded"}).state == JobState.SUCCEEDED


def test_a_tenants_event_stream_has_its_own_jobs_only_and_a_filter_without_tenant_still_matches(platform):
    """Job events' subjects end with their tenant (`job.succeeded.vision`): `?subject=job.succeeded` means every
    tenant's, and a tenant's token gets its own jobs' events only (the tenant read from the subject)."""
    import threading

    client = platform.client()
    vision = client.create_token(tenant="vision", user="ana").token
    got: list[dict] = []
    connected = threading.Event()

    def listen():
        got.extend(
            sse_events(platform.server, vision, {"subject": "job.succeeded"}, count=1, connected=connected)
        )

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert connected.wait(10), "the stream never said it was connected"
    nlp_job = client.submit({"command": "true", "resources": {"gpus": 1}, "tenant": "nlp"}).job_id
    platform.wait_state(nlp_job, {"succeeded"})
    vision_job = client.submit({"command": "true", "resources": {"gpus": 1}, "tenant": "vision"}).job_id
    listener.join(30)
    assert [(e["subject"], e["type"]) for e in got] == [(vision_job, "io.gpuyard.job.succeeded")]
