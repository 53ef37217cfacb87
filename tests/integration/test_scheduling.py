"""Scheduling through the real bus: `gpuyard up` with 4 simulated GPUs, the API, and `gpuyard why / ps / describe`.

Waiting jobs' reasons, positions and estimates; priority preemption and requeue as a new attempt; quota
reclaim. The platform runs with scheduler settings from the environment (GPUYARD_*): preemption after 0 s of
runtime (the default, 300 s, would make these tests wait five minutes), every reason stored at once, and two
tenants' guarantees.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.client import ClientError
from gpuyard.shared.contracts.jobstate import JobState

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration

GPUS = 4
SCHEDULER_ENV = {
    "GPUYARD_MIN_RUNTIME_BEFORE_PREEMPTION": "0",
    "GPUYARD_PENDING_AFTER": "0",  # these tests read the reasons of jobs that wait their turn briefly
    "GPUYARD_QUOTAS": "team-a=2,team-b=2",
    "GPUYARD_ACCEPT_UNPLACEABLE": "true",  # jobs no node could hold are queued (they take no place in line)
}
# Exits cleanly on SIGTERM (a preempted or cancelled job), after saying so in its log.
STOPPABLE = "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait"
LIVE = [JobState.QUEUED, JobState.PLACED, JobState.RUNNING]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("scheduling")
    p = Platform(base / "data", base / "config", simulate_gpus=GPUS, env=SCHEDULER_ENV).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(autouse=True)
def no_jobs_left(platform):
    """Every test starts on an idle cluster: cancel what a test (or its failure) left behind."""
    yield
    client = platform.client()
    for job in client.jobs(state=LIVE, limit=500).items:
        if not job.cancel_requested:
            with contextlib.suppress(ClientError):  # it may have ended in the meantime
                client.cancel(job.job_id)
    wait_for(lambda: not client.jobs(state=LIVE).items, 30, 0.2, "every job to end")


def submit(client, name: str, gpus: float, command: str = "sleep 60", cpus: float = 1, **spec) -> str:
    resources = {"gpus": gpus, "cpus": cpus, "memory": "100MB"}
    return client.submit({"name": name, "command": command, "resources": resources, **spec}).job_id


def events(client, job_id: str, kind: str | None = None) -> list[dict]:
    out = [e.event for e in client.events(job_id)]
    return [e for e in out if e["type"] == f"io.gpuyard.job.{kind}"] if kind else out


def first_reason(client, job_id: str, timeout: float = 15) -> dict:
    """The first pending reason the scheduler stored for the job (it may be placed a moment later)."""
    found = wait_for(
        lambda: events(client, job_id, "pending"), timeout, 0.1, f"a pending reason for {job_id}"
    )
    return found[0]["data"]["reason"]


def wait_ready(platform, job_id: str) -> None:
    """Running, and its SIGTERM trap is set (so a preemption stops it cleanly)."""
    client = platform.client()
    platform.wait_state(job_id, {"running"})
    wait_for(lambda: "ready" in client.logs(job_id), 10, 0.1, f"{job_id} to say ready")


def row_of(table: str, job_id: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(job_id))


def test_a_waiting_job_shows_reason_position_and_estimate_in_api_and_cli(platform):
    client = platform.client()
    blocker = submit(client, "blocker", GPUS, "sleep 60", timeout="10m")
    platform.wait_state(blocker, {"running"})
    first = submit(client, "wants-all", GPUS, "true")
    second = submit(client, "wants-one", 1, "true")
    # The last asks for every GPU too: when the head leaves, it waits behind the new head, whose end no time limit
    # bounds, so its estimated start stays unknown and its reason unchanged (a 1-GPU job would get the blocker's
    # end as its estimate, stored again once PENDING_REFRESH_SECONDS had passed: a race with the test's pace).
    third = submit(client, "wants-all-too", GPUS, "true")

    def all_waiting():
        jobs = [client.job(first), client.job(second), client.job(third)]
        return all(j.pending and j.pending.position for j in jobs) and jobs

    head, next_in_line, last = wait_for(all_waiting, 15, 0.1, "the jobs to have a place in line")
    assert last.pending.position == 3 and last.pending.estimated_start is None
    assert head.state == next_in_line.state == "queued"
    assert (head.pending.position, next_in_line.pending.position) == (1, 2)
    # The head holds the backfill reservation: it starts when the blocker's 10 min time limit is over.
    started = client.job(blocker).started_at
    estimate = head.pending.estimated_start
    assert abs(estimate - (started + timedelta(minutes=10))) < timedelta(seconds=5)
    assert next_in_line.pending.estimated_start is None

    why = platform.cli("why", first)
    assert why.returncode == 0, why.stderr
    text = why.stdout
    assert (
        f"waiting: {head.pending.code}: " in text.splitlines()[0]
    )  # as gpuyard.shared.contracts.api.jobs.pending_text renders it
    assert head.pending.message in text
    assert "#1 (1st in line)" in text
    assert "in about 10 min" in text or "in about 9 min" in text
    assert "default / admin" in text and "normal" in text and "4 GPUs" in text
    for key, value in head.pending.details.items():  # the numbers, compactly (4.0 GPUs as 4)
        assert f"{key}={value:g}" in text if isinstance(value, float) else f"{key}={value}" in text
    why_second = platform.cli("why", second).stdout
    assert "#2 (2nd in line)" in why_second and "unknown" in why_second

    as_json = json.loads(platform.cli("why", first, "--json").stdout)
    assert as_json["pending"]["code"] == head.pending.code
    assert as_json["pending"]["position"] == 1
    left = (estimate - datetime.now(UTC)).total_seconds()
    assert abs(as_json["pending"]["estimated_start_in_seconds"] - left) < 10

    running = platform.cli("why", blocker).stdout
    assert running.startswith("running on node-a")
    assert "Replica 0" in running and "node-a GPU 0, 1, 2, 3" in running

    table = platform.cli("ps").stdout
    assert table.splitlines()[0].split()[:5] == ["ID", "NAME", "TENANT", "STATE", "POS"]
    assert row_of(table, first).split()[3:5] == ["queued", "#1"]
    assert row_of(table, second).split()[3:5] == ["queued", "#2"]
    assert head.pending.code in row_of(table, first)
    described = platform.cli("describe", first).stdout
    assert f"{head.pending.code}: " in described and described.count("1st in line") == 1
    estimate_row = next(line for line in described.splitlines() if line.startswith("Estimated start"))
    assert estimate_row.split()[2:4] == ["in", "about"]

    # the head leaves: the last job moves up from the queue's line, with no reason of its own written again
    reasons = len(events(client, third, "pending"))
    client.cancel(first)
    moved = wait_for(
        lambda: client.job(third).pending.position == 2 and client.job(third), 15, 0.2, "3rd → 2nd"
    )
    assert moved.pending.estimated_start is None
    assert moved.pending.message.endswith("2nd in line") and len(events(client, third, "pending")) == reasons


def test_jobs_no_node_could_hold_wait_without_a_place_in_line_and_take_none(platform):
    client = platform.client()
    blocker = submit(client, "blocker", GPUS, "sleep 60")
    platform.wait_state(blocker, {"running"})
    huge = submit(client, "huge", 2 * GPUS, "true")
    other_model = client.submit(
        {
            "name": "h100",
            "command": "true",
            "resources": {"gpus": 1, "memory": "100MB", "gpu_model": ["H100"]},
        }
    ).job_id
    behind = submit(client, "behind-both", 1, "true")

    def all_told():
        jobs = [client.job(j) for j in (huge, other_model, behind)]
        return all(j.pending for j in jobs) and jobs

    too_large, no_model, next_in_line = wait_for(all_told, 15, 0.1, "the three jobs' reasons")
    assert (too_large.pending.code, too_large.pending.position) == ("too_large", None)
    assert (no_model.pending.code, no_model.pending.position) == ("no_matching_gpu_model", None)
    assert next_in_line.pending.position == 1
    table = platform.cli("ps").stdout
    assert row_of(table, behind).split()[3:5] == ["queued", "#1"]
    assert "in line" not in platform.cli("why", huge).stdout


def test_a_critical_job_preempts_a_low_one_which_is_requeued_and_runs_again(platform):
    client = platform.client()
    low = submit(client, "low", GPUS, STOPPABLE, priority="low")
    wait_ready(platform, low)
    urgent = submit(client, "urgent", GPUS, STOPPABLE, priority="critical")  # until it is cancelled below

    reason = first_reason(client, urgent)  # with the default 300 s minimum runtime: insufficient_gpus
    assert reason["code"] == "preempting" and low in reason["details"]["victims"], reason
    preempted = wait_for(lambda: events(client, low, "preempted"), 15, 0.1, "job.preempted")
    data = preempted[0]["data"]
    assert (data["job_id"], data["attempt"], data["cause"], data["by_job"]) == (low, 1, "priority", urgent)
    requeued = wait_for(lambda: events(client, low, "requeued"), 30, 0.1, "job.requeued")
    assert requeued[0]["data"]["attempt"] == 2 and requeued[0]["data"]["reason"] == "preempted"

    # The urgent job gets the GPUs; the low one waits, as attempt 2, and says why.
    assert platform.wait_state(urgent, {"running", "succeeded"}).placements[0].node == "node-a"
    waiting = wait_for(
        lambda: (j := client.job(low)).pending and j.state == "queued" and j, 10, 0.1, "low's reason"
    )
    assert waiting.attempt == 2
    assert waiting.attempts[0].summary == "preempted: priority"
    why = platform.cli("why", low).stdout
    assert "attempt 2" in why and "preempted" in why.split("Attempt 1", 1)[1].splitlines()[0]
    assert waiting.pending.message in why

    client.cancel(
        urgent
    )  # (it held the GPUs while `why` was asked: however slow the machine, low still waited)
    assert platform.wait_state(urgent, {"cancelled"}, timeout=30).state == "cancelled"
    again = platform.wait_state(low, {"running"}, timeout=30)
    assert again.attempt == 2 and len(again.placements[0].gpus) == GPUS
    kinds = [e["type"].removeprefix("io.gpuyard.job.") for e in events(client, low)]
    after = [k for k in kinds[kinds.index("preempted") :] if k != "pending"]
    assert after == ["preempted", "replica_exited", "requeued", "placed", "started"]
    exited = events(client, low, "replica_exited")[0]["data"]
    assert exited["attempt"] == 1 and exited["exit_code"] == 0  # the trap ran: it stopped cleanly
    assert "got-term" in client.logs(low, attempt=1)


def test_a_tenant_within_its_guarantee_reclaims_a_gpu_from_a_borrowing_tenant(platform):
    client = platform.client()
    borrowers = []
    for i in range(GPUS):  # team-a: 2 GPUs within its guarantee, then 2 borrowed idle ones
        borrowers.append(submit(client, f"a-{i}", 1, STOPPABLE, cpus=0.1, tenant="team-a"))
        wait_ready(platform, borrowers[-1])
    # CPUs are not what is short here: the simulated node has as many as this machine (maybe 2).
    owner = submit(client, "b-0", 1, STOPPABLE, cpus=0.1, tenant="team-b")  # until it is cancelled below

    reason = first_reason(client, owner)  # same priority: only a quota reclaim makes room
    youngest = borrowers[-1]  # borrowed, and the least work lost
    assert reason["code"] == "preempting" and reason["details"]["victims"] == [youngest], reason
    preempted = wait_for(lambda: events(client, youngest, "preempted"), 15, 0.1, "job.preempted")
    assert preempted[0]["data"]["cause"] == "reclaim" and preempted[0]["data"]["by_job"] == owner
    platform.wait_state(owner, {"running", "succeeded"})

    # team-a, at 3 GPUs for a guarantee of 2, finds nothing idle to borrow until team-b is done.
    waiting = wait_for(
        lambda: (j := client.job(youngest)).pending and j.state == "queued" and j, 10, 0.1, "a reason"
    )
    assert waiting.attempt == 2 and waiting.pending.code == "quota_exhausted"
    assert waiting.pending.details["used"] == 3 and waiting.pending.details["quota"] == 2
    for job_id in borrowers[:-1]:
        job = client.job(job_id)
        assert job.state == "running" and job.attempt == 1 and not events(client, job_id, "preempted")
    why = platform.cli("why", youngest).stdout
    assert "quota_exhausted" in why and "team-a" in why

    client.cancel(owner)  # (it held its GPU while `why` was asked: however slow the machine, team-a waited)
    assert platform.wait_state(owner, {"cancelled"}, timeout=30).state == "cancelled"
    assert platform.wait_state(youngest, {"running"}, timeout=30).attempt == 2
