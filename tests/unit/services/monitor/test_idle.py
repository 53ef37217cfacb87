"""Idle-GPU reclaim, the decision (`gpuyard.services.monitor.idle`): idle only when every sample of the window is under
the threshold, never in the start-up allowance, never on missing samples; warned, then stopped after the grace
unless a busy sample withdraws the warning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.services.monitor.idle import (
    IdlePolicy,
    IdleWatch,
    Verdict,
    judge,
    policy_for,
    stop_text,
    warning_text,
)

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)
POLICY = IdlePolicy(timeout=60, grace=30, threshold_pct=5, min_age=20)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(samples: list[tuple[float, float]], policy: IdlePolicy = POLICY, watch: IdleWatch | None = None):
    """Feed (second, utilization) samples one by one, acting on each verdict as the monitor does; the verdicts
    that were not NOTHING, with their second."""
    watch = watch or IdleWatch("job", 1, started_at=T0)
    seen = []
    for second, utilization in samples:
        watch.observe(at(second), utilization, policy, max_gap=5)
        found = judge(watch, policy)
        if found.verdict is Verdict.WARN:
            watch.warned_at = watch.last_at
        elif found.verdict is Verdict.WITHDRAW:
            watch.warned_at = None
        elif found.verdict is Verdict.STOP:
            watch.stopped = True
        if found.verdict is not Verdict.NOTHING:
            seen.append((second, found.verdict, found))
    return seen, watch


def every(start: float, end: float, utilization: float = 1.0) -> list[tuple[float, float]]:
    return [(float(s), utilization) for s in range(int(start), int(end) + 1)]


def test_an_idle_job_is_warned_after_its_allowance_and_a_whole_window_then_stopped_after_the_grace():
    seen, _ = run(every(0, 200, 1.0))
    assert [(s, v) for s, v, _ in seen] == [(80, Verdict.WARN), (110, Verdict.STOP)]
    warn, stop = seen[0][2], seen[1][2]
    assert warn.idle_since == at(20) and warn.idle_seconds == 60 and warn.max_utilization_pct == 1.0
    assert stop.idle_seconds == 90


def test_one_busy_sample_in_the_window_keeps_it_from_being_idle():
    samples = every(0, 200, 0.5)
    samples[70] = (70.0, 5.0)  # at the threshold: busy
    seen, _ = run(samples)
    assert seen[0][:2] == (130, Verdict.WARN)  # a whole window after the busy sample


def test_a_busy_sample_during_the_grace_withdraws_the_warning_and_nothing_is_stopped():
    samples = every(0, 100, 0.0) + [(101.0, 80.0)] + every(102, 150, 0.0)
    seen, watch = run(samples)
    assert [(s, v) for s, v, _ in seen] == [(80, Verdict.WARN), (101, Verdict.WITHDRAW)]
    assert not watch.stopped and watch.warned_at is None


def test_the_start_up_allowance_does_not_count():
    seen, _ = run(every(0, 79, 0.0))
    assert seen == []  # 60 s of samples, but 20 of them in the start-up


def test_a_gap_in_the_samples_starts_the_window_over():
    seen, _ = run(every(0, 60, 0.0) + every(70, 200, 0.0))  # a 10 s gap, more than max_gap (5 s)
    assert seen[0][:2] == (130, Verdict.WARN)


def test_no_samples_never_make_a_job_idle():
    watch = IdleWatch("job", 1, started_at=T0)
    assert judge(watch, POLICY).verdict is Verdict.NOTHING


def test_a_stopped_attempt_is_never_stopped_again():
    seen, watch = run(every(0, 300, 0.0))
    assert [v for _, v, _ in seen] == [Verdict.WARN, Verdict.STOP]
    assert judge(watch, POLICY).verdict is Verdict.NOTHING


def test_the_highest_utilization_is_that_of_the_window_only():
    samples = every(0, 30, 4.9) + every(31, 200, 1.0)
    seen, _ = run(samples)
    warn = seen[0]
    assert warn[0] == 80 and warn[2].max_utilization_pct == 4.9  # 4.9 at 20..30, in the window 20..80
    stop = seen[1]
    assert stop[0] == 110 and stop[2].max_utilization_pct == 1.0  # the window 50..110


def test_a_late_sample_of_another_node_counts_in_its_place():
    watch = IdleWatch("job", 1, started_at=T0)
    run(every(20, 60, 1.0), watch=watch)
    watch.observe(at(59), 3.0, POLICY, max_gap=5)  # node b's, older than node a's latest
    assert watch.peaks[0] == (at(59), 3.0)
    watch.observe(at(58), 50.0, POLICY, max_gap=5)  # and a busy one: the window starts after it
    seen, _ = run(every(61, 130, 1.0), watch=watch)
    assert seen[0][:2] == (118, Verdict.WARN)


@pytest.mark.parametrize(
    "spec, tenant, timeouts, expected",
    [
        ((60, None), "vision", {}, IdlePolicy(60, 600, 5, 300)),  # its own
        ((60, 10), "vision", {"vision": 1800}, IdlePolicy(60, 10, 5, 300)),  # its own before its tenant's
        ((None, None), "vision", {"vision": 1800}, IdlePolicy(1800, 600, 5, 300)),  # its tenant's
        ((None, None), "nlp", {"vision": 1800, "*": 7200}, IdlePolicy(7200, 600, 5, 300)),  # every tenant's
        ((None, None), "nlp", {"vision": 1800}, None),  # none
        ((0, None), "vision", {"vision": 1800}, None),  # off, whatever its tenant says
        ((None, None), "vision", {"vision": 0, "*": 60}, None),  # its tenant: off
    ],
)
def test_a_jobs_policy(spec, tenant, timeouts, expected):
    policy = policy_for(
        *spec, tenant, tenant_timeouts=timeouts, default_grace=600, threshold_pct=5, min_age=300
    )
    assert policy == expected


def test_the_messages_carry_the_figures():
    seen, _ = run(every(0, 200, 1.25))
    warn, stop = seen[0][2], seen[1][2]
    policy = IdlePolicy(timeout=1800, grace=600, threshold_pct=5, min_age=300)
    assert warning_text(policy, warn) == (
        "GPUs below 5% for 30m (highest 1.2%); stopping in 10m unless they get busy"
    )
    assert stop_text(policy, stop) == (
        "stopped for idle GPUs: every sample under 5% utilization for 1m30s (idle timeout 30m, grace 10m; "
        "highest 1.2% over the last 30m)"
    )
