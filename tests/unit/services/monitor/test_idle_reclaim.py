"""Idle-GPU reclaim, the monitor's side (`gpuyard.services.monitor.idlereclaim`, carried out by the alert service): from
samples and the live jobs to an `idle.warning` and a `job_idle` alert, then an `idle.stop` and the alert
resolved; a warning withdrawn when the GPUs get busy or the job ends; a new leader that restored the active
alert stops the job without warning it twice; what is recorded goes to the job's idle stream once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpuyard.services.monitor.alerts import ActiveAlert
from gpuyard.services.monitor.alertservice import AlertService
from gpuyard.services.monitor.idlereclaim import IdleReclaim, Record
from gpuyard.services.monitor.jobs import LiveJob
from gpuyard.services.monitor.rules import parse_rules
from gpuyard.shared.contracts.events.alerts import IdleStop, IdleWarning
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.readmodels import idlebook
from gpuyard.shared.stores.readmodels.alertbook import active_alerts

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def job(job_id="j1", state=JobState.RUNNING, attempt=1, idle_timeout=10.0, idle_grace=5.0, serves=False):
    return LiveJob(
        job_id=job_id, tenant="vision", user="ana", name="train", state=state, attempt=attempt,
        submitted_at=T0, started_at=T0, since=T0, borrowed=False, placements=(), replicas=1, serves=serves,
        idle_timeout=idle_timeout, idle_grace=idle_grace,
    )  # fmt: skip


def live(*jobs: LiveJob):
    return SimpleNamespace(jobs={j.job_id: j for j in jobs}, refreshed=True)


def reclaim(jobs, **overrides) -> IdleReclaim:
    values = {"tenant_timeouts": {}, "default_grace": 600, "threshold_pct": 5.0, "min_age": 2.0, **overrides}
    return IdleReclaim(jobs, **values)


def sample(second: float, *utilizations: tuple[str, float], node="node-a") -> tuple[GpuSample, datetime]:
    gpus = [
        GpuReading(
            index=i, uuid=f"GPU-{i}", utilization_pct=u, holders=[GpuHolder(job_id=j, tenant="vision")]
        )
        for i, (j, u) in enumerate(utilizations)
    ]
    return GpuSample(node=node, gpus=gpus), T0 + timedelta(seconds=second)


def feed(r: IdleReclaim, seconds, *utilizations) -> list:
    actions = []
    for s in seconds:
        actions += r.sample(*sample(s, *utilizations))
    return actions


def kinds(actions) -> list[str]:
    return [type(a.data).__name__ if isinstance(a, Record) else type(a).__name__ for a in actions]


def test_an_idle_job_is_warned_then_stopped_with_its_figures():
    r = reclaim(live(job()))
    actions = feed(r, range(0, 30), ("j1", 1.5))
    assert kinds(actions) == ["IdleWarning", "Raise", "IdleStop", "Resolve"]
    warning, raised, stop, resolved = actions
    assert warning.at == T0 + timedelta(seconds=12)  # 2 s of start-up, then 10 s of window
    assert warning.data.max_utilization_pct == 1.5 and warning.data.threshold_pct == 5.0
    assert warning.data.window_seconds == 10 and warning.data.grace_seconds == 5
    assert raised.data.alert_id == "job_idle/j1/1" and raised.data.tenant == "vision"
    assert stop.at == T0 + timedelta(seconds=17) and stop.data.idle_seconds == 15
    assert "under 5% utilization for 15s" in stop.data.message
    assert resolved.raised_id == raised.event_id


def test_one_busy_gpu_of_the_job_keeps_it_from_being_idle():
    r = reclaim(live(job()))
    assert feed(r, range(0, 30), ("j1", 0.0), ("j1", 60.0)) == []


def test_a_gpu_of_the_job_that_reports_no_utilization_keeps_it_from_being_idle():
    r = reclaim(live(job()))
    assert feed(r, range(0, 30), ("j1", 0.0), ("j1", None)) == []


def test_a_job_without_an_idle_timeout_or_a_serve_job_is_never_stopped():
    r = reclaim(live(job("a", idle_timeout=None), job("b", idle_timeout=0), job("c", serves=True)))
    assert feed(r, range(0, 60), ("a", 0.0), ("b", 0.0), ("c", 0.0)) == []


def test_the_tenant_default_applies_to_a_job_that_gives_none():
    r = reclaim(
        live(job(idle_timeout=None, idle_grace=None)), tenant_timeouts={"vision": 10}, default_grace=3
    )
    assert kinds(feed(r, range(0, 30), ("j1", 0.0))) == ["IdleWarning", "Raise", "IdleStop", "Resolve"]


def test_busy_again_during_the_grace_withdraws_the_warning():
    r = reclaim(live(job()))
    actions = (
        feed(r, range(0, 14), ("j1", 0.0)) + feed(r, [14], ("j1", 90.0)) + feed(r, range(15, 20), ("j1", 0))
    )
    assert kinds(actions) == ["IdleWarning", "Raise", "Resolve"]
    assert actions[-1].data.message == "its GPUs are busy again: it is not stopped"


def test_a_job_that_ends_while_warned_has_its_warning_withdrawn_once():
    jobs = live(job())
    r = reclaim(jobs)
    feed(r, range(0, 14), ("j1", 0.0))
    del jobs.jobs["j1"]
    assert kinds(r.jobs(T0)) == ["Resolve"]
    assert r.jobs(T0) == []


def test_a_repeated_sample_decides_nothing_new():
    r = reclaim(live(job()))
    first = feed(r, range(0, 13), ("j1", 0.0))
    assert kinds(first) == ["IdleWarning", "Raise"]
    assert feed(r, [12, 12], ("j1", 0.0)) == []


def test_a_new_leader_that_restored_the_alert_stops_after_the_grace_without_warning_again():
    r = reclaim(live(job()))
    warning, raised = feed(r, range(0, 13), ("j1", 0.0))
    successor = reclaim(live(job()))
    successor.restore([ActiveAlert(raised.data, raised.event_id, warning.at)])
    actions = feed(successor, range(13, 20), ("j1", 0.0))
    assert kinds(actions) == ["IdleStop", "Resolve"]
    assert actions[0].at == T0 + timedelta(seconds=17)
    assert actions[1].raised_id == raised.event_id


def test_a_new_attempt_is_watched_afresh_and_the_old_warning_withdrawn():
    jobs = live(job())
    r = reclaim(jobs)
    feed(r, range(0, 13), ("j1", 0.0))
    jobs.jobs["j1"] = job(attempt=2)
    actions = feed(r, [13], ("j1", 0.0))
    assert kinds(actions) == ["Resolve"] and actions[0].data.alert_id == "job_idle/j1/1"


class Bus:
    replicas = 1

    def __init__(self):
        self.published = []

    async def publish(self, event, **_):
        self.published.append(event)


@pytest.fixture
def store(tmp_path):
    s = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    yield s
    asyncio.run(s.close())


def alert_service(store, jobs) -> AlertService:
    service = SimpleNamespace(
        bus=Bus(), source="/gpuyard/monitor/test", settings=SimpleNamespace(max_deliver=5)
    )
    hooks = SimpleNamespace(send=lambda event: None)
    alerts = AlertService(service, parse_rules(None), store, None, hooks, instance="test", live=jobs)
    alerts.idle = reclaim(jobs)
    return alerts


async def test_the_alert_service_records_then_publishes_and_a_successor_records_nothing_twice(store):
    jobs = live(job())
    alerts = alert_service(store, jobs)
    for s in range(0, 30):
        await alerts.reclaim(alerts.idle.sample(*sample(s, ("j1", 0.0))))
    stream = [e.event for e in await store.read_stream(idlebook.stream_id("j1"))]
    assert [type(e.data) for e in stream] == [IdleWarning, IdleStop]
    assert [e.type for e in alerts.bus.published] == [
        "io.gpuyard.idle.warning", "io.gpuyard.alert.raised", "io.gpuyard.idle.stop", "io.gpuyard.alert.resolved"
    ]  # fmt: skip
    assert [await idlebook.holds(store, e) for e in stream] == [True, True]
    assert await active_alerts(store) == []

    successor = alert_service(store, jobs)  # the same samples again (a redelivery to a new leader)
    for s in range(0, 30):
        await successor.reclaim(successor.idle.sample(*sample(s, ("j1", 0.0))))
    assert len(await store.read_stream(idlebook.stream_id("j1"))) == 2
