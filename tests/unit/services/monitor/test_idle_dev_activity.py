"""A dev environment's user activity in the idle reclaim (`IdleReclaim.activity`, from `dev.activity`): busy at
its time as a busy sample would be, so an environment whose user works without the GPUs is kept; without
activity it is warned and stopped after its timeout as any job; a warning up is withdrawn by activity; old,
repeated, other attempts' and non-dev jobs' activity change nothing; the alert service's telemetry table takes
it."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import pytest

from gpuyard.services.monitor.idlereclaim import IdleReclaim
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.runtime.handlers import HandlerTable
from gpuyard.shared.stores.events import open_store
from tests.unit.services.monitor.test_idle_reclaim import T0, alert_service, job, kinds, live, reclaim, sample


@pytest.fixture
def store(tmp_path):
    s = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    yield s
    asyncio.run(s.close())


def dev_job(**kwargs):
    return dataclasses.replace(job(**kwargs), dev=True)


def activity(second: float, job_id="j1", attempt=1) -> DevActivity:
    return DevActivity(job_id=job_id, attempt=attempt, tenant="vision", at=T0 + timedelta(seconds=second))


def run(r: IdleReclaim, seconds, active_at=(), job_id="j1") -> list:
    """Samples of an idle GPU each second, and the user's activity at the seconds `active_at`."""
    actions = []
    for s in seconds:
        if s in active_at:
            actions += r.activity(activity(s, job_id))
        actions += r.sample(*sample(s, (job_id, 0.0)))
    return actions


def test_a_dev_environment_without_activity_is_warned_then_stopped_after_its_timeout():
    actions = run(reclaim(live(dev_job())), range(0, 30))
    assert kinds(actions) == ["IdleWarning", "Raise", "IdleStop", "Resolve"]
    assert actions[0].at == T0 + timedelta(seconds=12) and actions[2].at == T0 + timedelta(seconds=17)


def test_a_dev_environment_whose_user_is_active_is_kept_with_idle_gpus():
    r = reclaim(live(dev_job()))
    assert run(r, range(0, 60), active_at=range(0, 60, 8)) == []  # (active more often than its 10 s timeout)
    # then the user stops: a whole window after the last activity (56 s), it is warned; after the grace, stopped
    actions = run(r, range(60, 80))
    assert kinds(actions) == ["IdleWarning", "Raise", "IdleStop", "Resolve"]
    assert actions[0].at == T0 + timedelta(seconds=66) and actions[0].data.message.startswith("GPUs below 5%")


def test_activity_withdraws_a_warning_at_once_and_the_window_starts_over_there():
    r = reclaim(live(dev_job()))
    assert kinds(run(r, range(0, 14))) == ["IdleWarning", "Raise"]
    withdrawn = r.activity(activity(14))
    assert kinds(withdrawn) == ["Resolve"]
    assert withdrawn[0].data.message == "its user is active again: it is not stopped"
    assert r.activity(activity(14)) == []  # repeated: nothing more
    actions = run(r, range(15, 28))
    assert kinds(actions) == ["IdleWarning", "Raise"] and actions[0].at == T0 + timedelta(seconds=24)


def test_old_repeated_or_other_attempts_activity_changes_nothing():
    r = reclaim(live(dev_job()))
    run(r, range(0, 8), active_at=[7])
    assert r.activity(activity(3)) == [] and r.activity(activity(7)) == []  # older than, and as, the last one
    assert r.activity(activity(9, attempt=2)) == []  # another attempt's: not this attempt's activity
    actions = run(r, range(8, 20))
    assert actions[0].at == T0 + timedelta(seconds=17)  # idle since 7: its window ends at 17


def test_activity_for_a_job_that_is_not_a_running_dev_environment_is_passed_over():
    jobs = live(
        job("batch"), dev_job(job_id="queued", state=JobState.QUEUED), dev_job(job_id="off", idle_timeout=0)
    )
    r = reclaim(jobs)
    for job_id in ("batch", "queued", "off", "unknown"):
        assert r.activity(activity(5, job_id)) == []
    assert "batch" not in r.watches and "queued" not in r.watches
    actions = run(r, range(0, 14), active_at=range(0, 14), job_id="batch")  # a batch job's GPUs alone decide
    assert kinds(actions) == ["IdleWarning", "Raise"]


async def test_the_alert_services_handler_of_dev_activity_withdraws_the_warning(store):
    jobs = live(dev_job())
    alerts = alert_service(store, jobs)
    alerts.leading = True
    for s in range(0, 14):
        await alerts.reclaim(alerts.idle.sample(*sample(s, ("j1", 0.0))))
    assert [e.type for e in alerts.bus.published][-1] == "io.gpuyard.alert.raised"
    table = HandlerTable({DevActivity: alerts.on_dev_activity})
    await table(make_event(activity(14), source="/gpuyard/submit/test"))
    assert [e.type for e in alerts.bus.published][-1] == "io.gpuyard.alert.resolved"
