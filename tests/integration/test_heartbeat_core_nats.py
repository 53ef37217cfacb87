"""A node's heartbeat reaches the scheduler even while the telemetry stream refuses to store it (its disk full,
or, here, a stream that takes no more messages): the scheduler also hears `node.heartbeat` on a plain core-NATS
subscription, which gets every message published on the subject whether a stream stores it or not. While the
stream stores them again, each heartbeat comes twice (live and from the stream) and is taken once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from nats.js.api import DiscardPolicy
from nats.js.errors import APIError

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.main import follow_heartbeats
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuInfo, GpuSample, NodeHeartbeat
from gpuyard.shared.contracts.events.subjects import TELEMETRY_STREAM, Subject
from gpuyard.shared.settings.scheduler import SchedulerSettings

pytestmark = pytest.mark.integration


def heartbeat(node: str = "node-a"):
    data = NodeHeartbeat(
        node=node,
        gpus=[GpuInfo(index=0, uuid="GPU-0", model="SIM", memory_bytes=1 << 30)],
        cpus=8,
        memory_bytes=1 << 34,
    )
    return make_event(data, source="/test/executor")


async def eventually(check, what: str, within: float = 15):
    try:
        async with asyncio.timeout(within):
            while not check():  # noqa: ASYNC110 - polling a plain predicate
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def stream_refuses(bus: Bus, refuses: bool) -> None:
    """The telemetry stream keeps what it holds and refuses every new message (as a stream that failed a write
    on a full disk does), or takes them again."""
    info = await bus.js.stream_info(TELEMETRY_STREAM.name)
    config = info.config
    config.discard = DiscardPolicy.NEW if refuses else DiscardPolicy.OLD
    config.max_msgs = info.state.messages if refuses else -1
    await bus.js.update_stream(config)


async def test_a_heartbeat_the_stream_refuses_still_keeps_its_node_alive_and_each_is_taken_once(nats_url):
    bus = await Bus.connect([nats_url], name="test-scheduler", source="/test/scheduler")
    executor = await Bus.connect([nats_url], name="test-executor", source="/test/executor")
    try:
        await bus.ensure_streams()
        await executor.publish(make_event(GpuSample(node="node-a", gpus=[]), source="/test/monitor"))
        scheduler = SchedulerService(
            SimpleNamespace(bus=bus, ledger=None), SchedulerSettings(node_timeout=30)
        )
        handlers = SchedulerHandlers(scheduler)
        heard: list[str] = []  # the id of each heartbeat the scheduler is given, live or from the stream
        taken: list[str] = []  # ... and of those it took
        given, observe = handlers.on_heartbeat, scheduler.view.observe_node

        async def on_heartbeat(data, event):
            heard.append(event.id)
            await given(data, event)

        def observe_node(hb, now=None):
            taken.append(current[0])
            return observe(hb, now=now)

        current = [""]
        handlers.on_heartbeat, scheduler.view.observe_node = on_heartbeat, observe_node
        await follow_heartbeats(SimpleNamespace(bus=bus), handlers, node_timeout=30)

        await stream_refuses(bus, True)
        refused = heartbeat()
        current[0] = refused.id
        with pytest.raises(APIError, match="maximum messages"):  # the stream does not store it
            await executor.publish(refused)
        await eventually(lambda: "node-a" in scheduler.view.nodes, "the node's heartbeat, heard live")
        assert heard == [refused.id] and taken == [refused.id]
        first_seen = scheduler.view.nodes["node-a"].last_seen

        plain = heartbeat()  # published on core NATS alone: no stream is asked
        current[0] = plain.id
        await executor.nc.publish(Subject.NODE_HEARTBEAT.value, plain.to_json())
        await eventually(lambda: plain.id in taken, "a heartbeat published on core NATS")
        assert scheduler.view.nodes["node-a"].last_seen >= first_seen

        await stream_refuses(bus, False)  # space again: each heartbeat now comes twice
        stored = heartbeat()
        current[0] = stored.id
        await executor.publish(stored)
        await eventually(lambda: heard.count(stored.id) == 2, "the heartbeat live and from the stream")
        assert taken.count(stored.id) == 1
    finally:
        await executor.close()
        await bus.close()
