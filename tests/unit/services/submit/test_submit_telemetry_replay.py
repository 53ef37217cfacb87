"""The submit service reads the recent heartbeats again at start (services/submit/following.py): a node heard
of only through a heartbeat sent before the service started is known at once, as old as that heartbeat."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from gpuyard.services.submit import following, telemetry
from gpuyard.shared.bus.jetstream import decoding
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.events.subjects import subject_filter


def heartbeat(node: str, sent: datetime):
    return make_event(NodeHeartbeat(node=node, gpus=[], cpus=8, memory_bytes=1 << 30), source="/t", time=sent)


class StreamBus:
    """A bus whose watch delivers what the stream holds from `since` on, as JetStream would."""

    def __init__(self, stored):
        self.stored = stored
        self.since = None
        self.watched: list[str] = []
        self.subscribed: dict[str, object] = {}

    async def watch(self, subjects, handler, *, stream, since, name):
        self.since, self.watched = since, list(subjects)
        for event in self.stored:
            if event.time >= since:
                await handler(event, None)

    async def subscribe_to(self, model, handler):
        subject = subject_filter(model.subject)
        self.subscribed[subject] = decoding(model, handler, subject)


async def test_a_heartbeat_sent_before_the_start_is_read_again_and_counts_from_when_it_was_sent():
    now = datetime.now(UTC)
    bus = StreamBus(
        [heartbeat("old", now - timedelta(minutes=5)), heartbeat("recent", now - timedelta(seconds=4))]
    )
    seen = telemetry.Telemetry()
    await following.follow(bus, seen)
    assert bus.since <= now - timedelta(seconds=telemetry.RECENT_SECONDS - 1)
    assert set(seen.nodes) == {"recent"}  # (the stream gives only the recent ones)
    heard, _ = seen.nodes["recent"]
    assert abs(heard - (now - timedelta(seconds=4)).timestamp()) < 0.01  # as old as it is, not "now"
    seen.observe(heartbeat("recent", datetime.now(UTC)))
    assert time.time() - seen.nodes["recent"][0] < 1  # a live one: now


class Msg:
    def __init__(self, data: bytes):
        self.data = data


async def test_the_telemetry_streams_subjects_are_watched_and_node_lost_is_heard_live():
    bus = StreamBus([heartbeat("a", datetime.now(UTC))])
    seen = telemetry.Telemetry()
    await following.follow(bus, seen)
    assert sorted(bus.watched) == ["gpu.sample", "node.heartbeat", "service.heartbeat", "service.status"]
    assert [hb.node for hb in seen.live_nodes()] == ["a"]
    on_lost = bus.subscribed["node.lost"]
    await on_lost(Msg(b"not an event"))  # (passed over)
    lost = make_event(NodeLost(node="a", last_seen=datetime.now(UTC)), source="/t")
    await on_lost(Msg(lost.to_json()))
    assert seen.live_nodes() == [] and seen.lost == {"a"}
