"""`submit --follow` and the demo print each event as one readable line, built from the real event models."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpuyard.follow import event_line, parse_event
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobCheckpointed,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    RequeueReason,
)
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text


def line(data) -> str:
    """The line for an event as the API serves it (JSON), without its time."""
    time, text = event_line(json.loads(make_event(data, source="/test").to_json())).split("  ", 1)
    assert len(time) == 12 and time[2] == time[5] == ":"
    return text


def test_preemption_says_why_by_whom_and_the_grace():
    preempted = JobPreempted(
        job_id="j", attempt=1, cause=PreemptionCause.PRIORITY, by_job="urgent", grace_seconds=15
    )
    said = preemption_text(PreemptionCause.PRIORITY)
    assert line(preempted) == f"preempted ({said}) by job urgent: stopping within 15s"
    drained = JobPreempted(job_id="j", attempt=1, cause=PreemptionCause.DRAIN, node="n1", grace_seconds=15)
    assert line(drained) == "preempted (drain: node n1 is being drained): stopping within 15s"


def test_preemption_says_the_work_it_loses_when_known():
    def lost(seconds: float) -> str:
        return line(
            JobPreempted(
                job_id="j",
                attempt=1,
                cause=PreemptionCause.DRAIN,
                node="n1",
                grace_seconds=15,
                lost_work_seconds=seconds,
            )
        )

    drained = "preempted (drain: node n1 is being drained): stopping within 15s"
    assert lost(725) == f"{drained}; lost about 12 min of work"
    assert lost(59.5) == f"{drained}; lost under a minute of work"
    assert lost(90) == f"{drained}; lost about 2 min of work"


def test_start_and_requeue_name_where_and_which_attempt():
    assert (
        line(JobStarted(job_id="j", attempt=1, node="n1", replicas=[0, 1])) == "started on n1 (replicas 0, 1)"
    )
    requeued = JobRequeued(job_id="j", attempt=2, reason=RequeueReason.PREEMPTED, message="priority")
    assert line(requeued).startswith("requeued as attempt 2 (preempted)")


def test_an_event_this_cli_does_not_know_is_shown_by_its_type():
    raw = json.loads(
        make_event(JobStarted(job_id="j", attempt=1, node="n1", replicas=[0]), source="/t").to_json()
    )
    raw["type"] = "io.gpuyard.job.hibernated"
    assert parse_event(raw) is None
    assert event_line(raw).endswith("  io.gpuyard.job.hibernated")


def test_a_replica_end_names_its_exit_code_or_signal_and_never_says_none():
    def ended(**how) -> str:
        return line(JobReplicaExited(job_id="j", attempt=1, node="n1", replica=1, **how))

    assert ended(exit_code=3) == "replica 1 exited (exit 3)"
    assert ended(signal=9) == "replica 1 exited (signal 9 (SIGKILL))"
    assert ended(message="node n1 was lost") == "replica 1 exited (no exit status): node n1 was lost"


def test_a_checkpoint_says_its_step_size_and_attempt():
    saved = JobCheckpointed(job_id="j", attempt=2, step=1200, size_bytes=3 << 20, saved_at=datetime.now(UTC))
    assert line(saved) == "checkpoint at step 1200 (3 MiB, attempt 2)"
