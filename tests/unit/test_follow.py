"""`submit --follow` and the demo print each event as one readable line, built from the real event models."""

from __future__ import annotations

import json

from gpuyard.follow import describe_event
from shared.events import JobPreempted, JobRequeued, JobStarted, RequeueReason, make_event


def line(data) -> str:
    return describe_event(json.loads(make_event(data, source="/test").to_json()))


def test_preemption_says_why_by_whom_and_the_grace():
    text = line(JobPreempted(job_id="j", attempt=1, reason="priority", by_job="urgent", grace_seconds=15))
    assert text == "preempted (priority) by job urgent: stopping within 15s"


def test_start_and_requeue_name_where_and_which_attempt():
    assert (
        line(JobStarted(job_id="j", attempt=1, node="n1", replicas=[0, 1])) == "started on n1 (replicas 0, 1)"
    )
    requeued = JobRequeued(job_id="j", attempt=2, reason=RequeueReason.PREEMPTED, message="priority")
    assert line(requeued).startswith("requeued as attempt 2 (preempted)")
