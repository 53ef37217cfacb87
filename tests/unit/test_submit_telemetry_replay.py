"""The submit service reads the recent heartbeats again at start (services/submit/telemetry.py): a node heard
of only through a heartbeat sent before the service started is known at once, as old as that heartbeat."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from gpuyard.services.submit import telemetry
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat


def heartbeat(node: str, sent: datetime):
    return make_event(NodeHeartbeat(node=node, gpus=[], cpus=8, memory_bytes=1 << 30), source="/t", time=sent)


class StreamBus:
    """A bus whose watch delivers what the stream holds from `since` on, as JetStream would."""

    def __init__(self, stored):
        self.stored = stored
        self.since = None

    async def watch(self, subjects, handler, *, stream, since, name):
        self.since = since
        for event in self.stored:
            if event.time >= since:
                await handler(event, None)

    async def subscribe(self, subject, cb):
        return None


async def test_a_heartbeat_sent_before_the_start_is_read_again_and_counts_from_when_it_was_sent():
    now = datetime.now(UTC)
    bus = StreamBus(
        [heartbeat("old", now - timedelta(minutes=5)), heartbeat("recent", now - timedelta(seconds=4))]
    )
    seen = telemetry.Telemetry()
    await seen.follow(bus)
    assert bus.since <= now - timedelta(seconds=telemetry.RECENT_SECONDS - 1)
    assert set(seen.nodes) == {"recent"}  # (the stream gives only the recent ones)
    heard, _ = seen.nodes["recent"]
    assert abs(heard - (now - timedelta(seconds=4)).timestamp()) < 0.01  # as old as it is, not "now"
    seen.observe(heartbeat("recent", datetime.now(UTC)))
    assert time.time() - seen.nodes["recent"][0] < 1  # a live one: now
