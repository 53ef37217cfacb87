"""An executor process lets go of an attempt once it has recorded its end, and passes over the ends of
attempts other processes hold without decoding them."""

from __future__ import annotations

from types import SimpleNamespace

from gpuyard.shared.bus.headers import ENTITY_HEADER
from gpuyard.shared.contracts.events.subjects import Subject, subject_filter


def control_msg(subject: Subject, job_id: str | None):
    headers = {ENTITY_HEADER: job_id} if job_id else {}
    return SimpleNamespace(subject=subject_filter(subject, "team"), headers=headers)


async def test_an_attempt_whose_end_it_recorded_is_let_go_without_its_end_event(h):
    ex = await h.executor()
    job = await h.submit(command=["true"])
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    assert job not in {record.key.job_id for record in ex.attempts}  # no JobSucceeded was delivered


async def test_only_the_ends_of_attempts_it_holds_concern_it(h):
    ex = await h.executor()
    job = await h.submit(command=["sleep", "30"])
    await h.place(ex, job)
    await h.wait(job, "running")
    for subject in (Subject.JOB_SUCCEEDED, Subject.JOB_FAILED, Subject.JOB_CANCELLED, Subject.JOB_PREEMPTED):
        assert ex.concerns(control_msg(subject, job))
        assert not ex.concerns(control_msg(subject, "another-job"))
    assert ex.concerns(control_msg(Subject.JOB_REQUEUED, job))
    assert ex.concerns(control_msg(Subject.JOB_CANCEL_REQUESTED, "another-job"))  # placed here, not started
    assert ex.concerns(control_msg(Subject.JOB_SUCCEEDED, None))  # a publisher that did not say: decoded
