"""The scheduler learns a node from its heartbeat, as seen when it was sent: heartbeats read again after a
start make the node known at once, and an old one does not make a silent node look alive."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.settings.scheduler import SchedulerSettings


def heartbeat(sent: float):
    data = NodeHeartbeat(
        node="n1",
        gpus=[GpuInfo(index=0, uuid="GPU-0", model="SIM", memory_bytes=1 << 30)],
        cpus=8,
        memory_bytes=1 << 34,
    )
    return make_event(data, source="/test", time=datetime.fromtimestamp(sent, UTC))


async def test_a_heartbeat_counts_from_when_it_was_sent() -> None:
    service = SimpleNamespace(ledger=None, bus=SimpleNamespace(js=None, replicas=1))
    scheduler = SchedulerService(service, SchedulerSettings(node_timeout=30))
    handlers = SchedulerHandlers(scheduler)
    now = time.time()
    beat = heartbeat(now - 20)
    await handlers.on_heartbeat(beat.data, beat)  # read again at start: sent 20 s ago
    assert "n1" in scheduler.view.nodes and scheduler.wake.is_set()
    assert scheduler.view.lost_nodes(30, now=now) == []
    assert [r.heartbeat.node for r in scheduler.view.lost_nodes(30, now=now + 11)] == ["n1"]
    beat = heartbeat(now + 3600)
    await handlers.on_heartbeat(beat.data, beat)  # a clock ahead of ours counts as now
    assert scheduler.view.nodes["n1"].last_seen <= time.time()
