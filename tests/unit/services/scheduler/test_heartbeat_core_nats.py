"""The scheduler hears a node's heartbeat twice: live (a plain core-NATS subscription, which gets it even while
the telemetry stream cannot store it) and from the stream. Each is taken once, the newest of each node winning:
the stream's copy of a heartbeat already taken, or an older heartbeat delivered late, changes nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.bus.jetstream import decoding
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.runtime.handlers import HandlerTable
from gpuyard.shared.settings.scheduler import SchedulerSettings


def heartbeat(sent: float, node: str = "n1", gpus: int = 1):
    data = NodeHeartbeat(
        node=node,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model="SIM", memory_bytes=1 << 30) for i in range(gpus)],
        cpus=8,
        memory_bytes=1 << 34,
    )
    return make_event(data, source="/test", time=datetime.fromtimestamp(sent, UTC))


def scheduler() -> SchedulerService:
    service = SimpleNamespace(ledger=None, bus=SimpleNamespace(js=None, replicas=1))
    made = SchedulerService(service, SchedulerSettings(node_timeout=30))
    made.observed = []
    observe = made.view.observe_node

    def counted(hb, now=None):
        made.observed.append((hb.node, now))
        return observe(hb, now=now)

    made.view.observe_node = counted
    made.heartbeats_table = HandlerTable({NodeHeartbeat: SchedulerHandlers(made).on_heartbeat})
    return made


async def from_stream(s: SchedulerService, event) -> None:
    """A heartbeat as the stream's watch hands it over."""
    await s.heartbeats_table(event)


async def live(s: SchedulerService, msg) -> None:
    """A message of the plain core-NATS subscription (`Bus.subscribe_to`)."""
    await decoding(NodeHeartbeat, s.heartbeats_table.handlers[NodeHeartbeat], "node.heartbeat")(msg)


async def test_a_heartbeat_heard_live_and_from_the_stream_is_taken_once():
    s = scheduler()
    now = float(int(time.time()))  # (whole seconds: the times round-trip exactly)
    beat = heartbeat(now - 1)
    await live(s, SimpleNamespace(data=beat.to_json(), subject="node.heartbeat"))
    await from_stream(s, beat)  # the stream's copy
    assert s.observed == [("n1", now - 1)]
    assert s.view.nodes["n1"].last_seen == now - 1


async def test_an_older_heartbeat_delivered_late_does_not_make_a_node_look_older_or_younger():
    s = scheduler()
    now = float(int(time.time()))  # (whole seconds: the times round-trip exactly)
    newer, older = heartbeat(now - 1, gpus=2), heartbeat(now - 6, gpus=1)
    await from_stream(s, newer)
    await from_stream(s, older)  # the stream catching up after the live one
    assert s.observed == [("n1", now - 1)] and len(s.view.nodes["n1"].heartbeat.gpus) == 2
    await from_stream(s, heartbeat(now, gpus=2))
    assert s.view.nodes["n1"].last_seen == now and len(s.observed) == 2
    assert s.view.lost_nodes(30, now=now + 29) == []


async def test_nodes_are_told_apart_and_a_lost_node_is_not_brought_back_by_a_late_old_copy():
    s = scheduler()
    now = float(int(time.time()))  # (whole seconds: the times round-trip exactly)
    await from_stream(s, heartbeat(now - 100, node="n1"))
    await from_stream(s, heartbeat(now - 100, node="n2"))
    assert set(s.view.nodes) == {"n1", "n2"}
    for rec in s.view.lost_nodes(30, now=now):
        s.view.forget_node(rec.heartbeat.node)
    await from_stream(s, heartbeat(now - 101, node="n1"))  # a late copy from before it was lost
    assert "n1" not in s.view.nodes
    await from_stream(s, heartbeat(now, node="n1"))  # it is back
    assert "n1" in s.view.nodes


async def test_what_is_not_an_event_on_the_live_subject_is_ignored():
    s = scheduler()
    await live(s, SimpleNamespace(data=b"not json", subject="node.heartbeat"))
    await live(s, SimpleNamespace(data=b'{"specversion": "1.0"}', subject="node.heartbeat"))
    assert s.view.nodes == {} and s.observed == []
