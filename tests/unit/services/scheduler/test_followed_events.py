"""The job events the scheduler reads from the bus, and those it does without: one or the other for each."""

from gpuyard.services.scheduler.handlers import CHANGES_DECISIONS, FOLLOWED, NOT_FOLLOWED
from gpuyard.shared.contracts.events.subjects import JOB_SUBJECTS


def test_every_job_event_is_followed_or_said_why_not():
    followed, skipped = {model.subject for model in FOLLOWED}, set(NOT_FOLLOWED)
    assert not followed & skipped
    assert followed | skipped == set(JOB_SUBJECTS)  # a new job event must be placed in one of them


def test_every_event_that_wakes_a_cycle_is_followed():
    assert set(CHANGES_DECISIONS) <= {model.subject for model in FOLLOWED}
