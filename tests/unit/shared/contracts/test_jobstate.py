"""The state machine: legal paths, refusals, stale attempts."""

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    PendingReason,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import (
    Attempt,
    IllegalTransition,
    JobState,
    JobView,
    StaleEvent,
    apply,
    fold,
)
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.stops import AttemptOutcome, PreemptionCause

T0 = datetime(2026, 1, 1, tzinfo=UTC)
J = "job1"


def ev(data, minutes=0):
    return make_event(data, source="/test", time=T0 + timedelta(minutes=minutes))


def submitted():
    return ev(
        JobSubmitted(job_id=J, name="n", tenant="t", user="u", spec=JobSpec(command="true", max_retries=1))
    )


def placed(attempt=1):
    return ev(JobPlaced(job_id=J, attempt=attempt, placements=[ReplicaPlacement(replica=0, node="n1")]), 1)


def started(attempt=1):
    return ev(JobStarted(job_id=J, attempt=attempt, node="n1", replicas=[0]), 2)


def test_happy_path_is_derived_from_events():
    view = fold([submitted(), placed(), started(), ev(JobSucceeded(job_id=J, attempt=1), 5)])
    assert view.state == JobState.SUCCEEDED
    assert view.version == 4
    assert view.exit_code == 0
    assert view.started_at == T0 + timedelta(minutes=2)
    assert view.finished_at == T0 + timedelta(minutes=5)
    assert view.attempts[0].nodes == ["n1"]


def test_failure_keeps_exit_code_and_reason():
    exited = ev(
        JobReplicaExited(
            job_id=J, attempt=1, node="n1", replica=0, exit_code=3, reason=FailureReason.EXIT_CODE
        )
    )
    failed = ev(
        JobFailed(
            job_id=J, attempt=1, reason=FailureReason.EXIT_CODE, message="exited with code 3", exit_code=3
        )
    )
    view = fold([submitted(), placed(), started(), exited, failed])
    assert (view.state, view.exit_code, view.failure_reason) == (JobState.FAILED, 3, FailureReason.EXIT_CODE)


@pytest.mark.parametrize(
    ("history", "event"),
    [
        ([], lambda: placed()),  # never submitted
        ([submitted], lambda: submitted()),  # submitted twice
        ([submitted], lambda: started()),  # queued -> running skips placed
        ([submitted, placed, started], lambda: placed()),  # running -> placed
        ([submitted, placed, started, lambda: ev(JobSucceeded(job_id=J, attempt=1))], lambda: started()),
        ([submitted, lambda: ev(JobCancelled(job_id=J, attempt=1, by="u"))], lambda: placed()),
        ([submitted], lambda: ev(JobSucceeded(job_id=J, attempt=1))),
    ],
)
def test_illegal_transitions_are_refused_with_the_offending_event(history, event):
    view = fold([h() for h in history])
    bad = event()
    with pytest.raises(IllegalTransition) as exc:
        apply(view, bad)
    assert exc.value.event is bad


def test_requeue_starts_a_new_attempt_and_old_attempt_events_are_stale():
    requeued = ev(JobRequeued(job_id=J, attempt=2, reason=RequeueReason.RETRY, message="retry 1/1"), 3)
    view = fold([submitted(), placed(), started(), requeued])
    assert view.state == JobState.QUEUED and view.attempt == 2
    assert [(a.outcome, a.requeue) for a in view.attempts] == [
        (AttemptOutcome.REQUEUED, RequeueReason.RETRY),
        (None, None),
    ]
    assert [a.summary for a in view.attempts] == ["requeued: retry", None]
    assert view.placements == []
    with pytest.raises(StaleEvent):
        apply(view, ev(JobSucceeded(job_id=J, attempt=1)))
    with pytest.raises(StaleEvent):
        apply(view, ev(JobRequeued(job_id=J, attempt=2, reason=RequeueReason.RETRY)))
    assert apply(view, placed(attempt=2)).state == JobState.PLACED


def test_why_the_last_attempt_ended_is_said_while_queued_and_not_once_placed_again():
    drained = JobRequeued(
        job_id=J, attempt=2, reason=RequeueReason.PREEMPTED, message="drain: node vm is being drained"
    )
    view = fold([submitted(), placed(), started(), ev(drained, 3)])
    assert view.message == "drain: node vm is being drained"
    again = apply(view, placed(attempt=2))
    assert again.message == "" and again.attempts[0].message == "drain: node vm is being drained"


def test_a_preempted_attempt_says_the_cause_and_the_node_of_its_preemption():
    drained = JobPreempted(job_id=J, attempt=1, cause=PreemptionCause.DRAIN, node="n1", grace_seconds=5)
    requeued = JobRequeued(job_id=J, attempt=2, reason=RequeueReason.PREEMPTED, message=drained.text)
    view = fold([submitted(), placed(), started(), ev(drained, 3), ev(requeued, 4)])
    ended = view.attempts[0]
    assert (ended.outcome, ended.requeue, ended.preemption, ended.node) == (
        AttemptOutcome.PREEMPTED,
        RequeueReason.PREEMPTED,
        PreemptionCause.DRAIN,
        "n1",
    )
    assert ended.summary == "preempted: drain" and ended.message == "drain: node n1 is being drained"
    assert view.preempt_requested is None and view.attempts[1].outcome is None


def test_a_failed_attempt_says_its_failure_reason_and_a_cancelled_one_its_outcome():
    failed = JobFailed(
        job_id=J, attempt=1, reason=FailureReason.CUDA_OOM, message="replica 0: CUDA OOM", exit_code=1
    )
    [ended] = fold([submitted(), placed(), started(), ev(failed, 3)]).attempts
    assert (ended.outcome, ended.failure, ended.exit_code, ended.summary) == (
        AttemptOutcome.FAILED,
        FailureReason.CUDA_OOM,
        1,
        "failed: cuda_oom",
    )
    [cancelled] = fold([submitted(), ev(JobCancelled(job_id=J, attempt=1, by="u"), 1)]).attempts
    assert (cancelled.outcome, cancelled.failure, cancelled.summary) == (
        AttemptOutcome.CANCELLED,
        None,
        "cancelled",
    )


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("succeeded", (AttemptOutcome.SUCCEEDED, None, None)),
        ("cancelled", (AttemptOutcome.CANCELLED, None, None)),
        ("failed: cuda_oom", (AttemptOutcome.FAILED, FailureReason.CUDA_OOM, None)),
        ("requeued: node_lost", (AttemptOutcome.REQUEUED, None, RequeueReason.NODE_LOST)),
        ("requeued: preempted", (AttemptOutcome.PREEMPTED, None, RequeueReason.PREEMPTED)),
        ("failed: a reason of a later release", (AttemptOutcome.FAILED, None, None)),
    ],
)
def test_an_attempt_stored_with_its_outcome_in_words_reads_back_structured(text, read):
    stored = {"number": 1, "queued_at": T0.isoformat(), "outcome": text}
    attempt = Attempt.model_validate(stored)
    assert (attempt.outcome, attempt.failure, attempt.requeue) == read


def test_a_view_stored_by_an_earlier_release_reads_back_with_its_preemption_and_attempts_structured():
    view = fold([submitted(), placed(), started()])
    stored = view.model_dump(mode="json")
    stored["preempt_requested"] = {"job_id": J, "attempt": 1, "reason": "drain: node n1 is being drained"}
    again = JobView.model_validate(stored)
    asked = again.preempt_requested
    assert (asked.cause, asked.node, asked.message) == (PreemptionCause.DRAIN, "n1", "")


def test_a_job_that_succeeds_on_a_later_attempt_carries_no_word_of_the_earlier_failure():
    requeued = ev(
        JobRequeued(job_id=J, attempt=2, reason=RequeueReason.RETRY, message="exit code 3; retry 1/1"), 3
    )
    view = fold(
        [
            submitted(),
            placed(),
            started(),
            requeued,
            placed(2),
            started(2),
            ev(JobSucceeded(job_id=J, attempt=2)),
        ]
    )
    assert view.state == JobState.SUCCEEDED and view.message == "" and view.exit_code == 0
    assert view.attempts[0].message == "exit code 3; retry 1/1"  # kept where it belongs


def test_cancel_request_and_pending_keep_the_state():
    pending = ev(JobPending(job_id=J, attempt=1, reason=PendingReason(code="insufficient_gpus", message="m")))
    view = fold([submitted(), pending])
    assert view.state == JobState.QUEUED and view.pending.code == "insufficient_gpus"
    view = apply(fold([submitted(), placed(), started()]), ev(JobCancelRequested(job_id=J, by="u")))
    assert view.state == JobState.RUNNING and view.cancel_requested
    assert apply(view, ev(JobCancelled(job_id=J, attempt=1, by="u"))).state == JobState.CANCELLED


def test_apply_does_not_mutate_its_input():
    view = fold([submitted()])
    apply(view, placed())
    assert view.state == JobState.QUEUED and view.version == 1


def test_no_event_changes_an_earlier_view():
    """apply copies only what it changes: every earlier view must stay exactly as it was."""
    exited = JobReplicaExited(
        job_id=J, attempt=1, node="n1", replica=0, exit_code=1, reason=FailureReason.EXIT_CODE, log_tail=["x"]
    )
    history = [
        submitted(),
        ev(
            JobPending(
                job_id=J, attempt=1, reason=PendingReason(code=PendingCode.INSUFFICIENT_GPUS, message="full")
            ),
            1,
        ),
        placed(),
        started(),
        ev(exited, 3),
        ev(JobRequeued(job_id=J, attempt=2, reason=RequeueReason.RETRY, message="retry"), 4),
        ev(JobCancelRequested(job_id=J, by="u"), 5),
        ev(JobCancelled(job_id=J, attempt=2, by="u"), 6),
    ]
    views, dumps, view = [], [], None
    for event in history:
        view = apply(view, event)
        views.append(view)
        dumps.append(view.model_dump())
    assert [v.model_dump() for v in views] == dumps
    assert views[-1].attempts[0].outcome == AttemptOutcome.REQUEUED and views[3].attempts[0].outcome is None
    assert views[-1].exits == [] and len(views[4].exits) == 1
