"""The alert service's record and delivery, on a real embedded store with a bus that only keeps what it is given:
what the engine decides is stored then published; every alert that comes back on the bus (its own, or another
service's) goes to the webhooks once; what could not be published waits in the store for the outbox relay."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpuyard.services.monitor.alerts import JobSnapshot
from gpuyard.services.monitor.alertservice import AlertService
from gpuyard.services.monitor.rules import parse_rules
from gpuyard.shared.bus.permissions import Role, permissions, publishers
from gpuyard.shared.contracts.events.alerts import AlertRaised
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.readmodels.alertbook import active_alerts


class Bus:
    replicas = 1

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.published = []

    async def publish(self, event, **_):
        if self.fail:
            raise ConnectionError("NATS away")
        self.published.append(event)


class Hooks:
    def __init__(self):
        self.sent = []

    def send(self, event):
        self.sent.append(event)


@pytest.fixture
def store(tmp_path):
    s = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    yield s
    asyncio.run(s.close())


def alert_service(store, bus, rules=None) -> AlertService:
    service = SimpleNamespace(
        bus=bus, source="/gpuyard/monitor/test", settings=SimpleNamespace(max_deliver=5)
    )
    alerts = AlertService(service, rules or parse_rules(None), store, None, Hooks(), instance="test")
    alerts.leading = True
    return alerts


def waiting_job(minutes: float) -> JobSnapshot:
    return JobSnapshot("j1", "vision", "ana", "train", datetime.now(UTC) - timedelta(minutes=minutes))


def test_a_raise_is_stored_then_published_and_reaches_the_webhooks_once(store):
    async def go():
        bus = Bus()
        alerts = alert_service(store, bus)
        await alerts.apply(alerts.engine.jobs([waiting_job(31)], [], datetime.now(UTC)))
        [event] = bus.published
        [view] = await active_alerts(store)
        assert view.raised_id == event.id and view.raised.alert_id == "job_waiting/j1"
        assert await store.unpublished(older_than=0) == []  # marked published
        for _ in range(2):  # back from the bus, and redelivered
            await alerts.on_alert(event.data, event)
        assert alerts.webhooks.sent == [event]
        await alerts.apply(alerts.engine.jobs([], [], datetime.now(UTC)))
        resolved = bus.published[-1]
        await alerts.on_alert(resolved.data, resolved)
        assert alerts.webhooks.sent == [event, resolved] and await active_alerts(store) == []

    asyncio.run(go())


def test_another_services_alert_is_recorded_and_delivered(store):
    async def go():
        alerts = alert_service(store, Bus())
        data = AlertRaised(
            alert_id="gpu_memory_over_slice/n/0/j1/0", kind="gpu_memory_over_slice", message="over"
        )
        event = make_event(data, source="/gpuyard/executor/x")
        await alerts.on_alert(event.data, event)
        [view] = await active_alerts(store)
        assert view.raised == data and alerts.webhooks.sent == [event]

    asyncio.run(go())


def test_an_alert_that_cannot_be_published_waits_in_the_store_for_the_relay(store):
    async def go():
        alerts = alert_service(store, Bus(fail=True))
        await alerts.apply(alerts.engine.jobs([waiting_job(45)], [], datetime.now(UTC)))
        [pending] = await store.unpublished(older_than=0)
        assert pending.data.alert_id == "job_waiting/j1"

    asyncio.run(go())


def test_a_new_leader_reads_the_active_alerts_and_raises_none_again(store):
    async def go():
        first = alert_service(store, Bus())
        await first.apply(first.engine.jobs([waiting_job(40)], [], datetime.now(UTC)))
        bus = Bus()
        second = alert_service(store, bus)
        await second.gained()
        job = JobSnapshot("j2", "vision", "ana", "other", datetime.now(UTC), 0)
        await second.apply(second.engine.jobs([waiting_job(40)], [job], datetime.now(UTC)))
        assert bus.published == []
        await second.apply(second.engine.jobs([], [], datetime.now(UTC)))
        [resolved] = bus.published
        assert resolved.data.alert_id == "job_waiting/j1" and await active_alerts(store) == []

    asyncio.run(go())


def test_job_rules_are_read_more_often_when_their_for_is_short(store):
    assert alert_service(store, Bus()).job_poll_seconds == 15
    short = parse_rules({"rules": {"job_silent": {"for": "20s"}}})
    assert alert_service(store, Bus(), short).job_poll_seconds == 5


def test_the_monitors_bus_user_may_read_what_the_alerts_need_and_publish_only_its_own():
    granted = permissions(Role.MONITOR).publish
    for stream in (
        "GPUYARD_EVENTS",
        "GPUYARD_TELEMETRY",
    ):  # alert.> and node.lost; gpu.sample, node.heartbeat
        assert f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>" in granted and f"$JS.ACK.{stream}.>" in granted
    assert "$KV.gpuyard-leases.>" in granted and "deadletter.>" in granted  # the lease; its durable consumer
    assert {"alert.raised", "alert.resolved", "gpu.sample"} <= set(granted)
    assert "node.lost" not in granted and not any(s.startswith("job.") for s in granted)
    assert Role.MONITOR in publishers(Subject.ALERT_RAISED) and Role.MONITOR in publishers(
        Subject.ALERT_RESOLVED
    )
