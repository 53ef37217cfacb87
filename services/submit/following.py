"""What the submit service follows on the bus, wired to its telemetry's recorders: the heartbeats, statuses
and samples of the last RECENT_SECONDS read again from the telemetry stream, then every new one (a watch with a
handler table, `gpuyard.shared.runtime.handlers`), and node.lost as it comes (`Bus.subscribe_to`). A submit
service that just started knows the nodes and services at once, not at their next heartbeat."""

from __future__ import annotations

import time

from gpuyard.services.submit.telemetry import Recorder, Telemetry
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import GpuSample, NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.events.services import ServiceHeartbeat, ServiceStatus
from gpuyard.shared.contracts.events.subjects import TELEMETRY_STREAM
from gpuyard.shared.runtime.handlers import Handler, HandlerTable

STREAMED = (NodeHeartbeat, ServiceHeartbeat, ServiceStatus, GpuSample)
"""Read from the telemetry stream, the recent ones again at start."""
LIVE = (NodeLost,)
"""Heard as they come (core NATS)."""


def _handler(record: Recorder) -> Handler:
    async def handle(data, event: CloudEvent) -> None:
        record(data, event)

    return handle


async def follow(bus: Bus, telemetry: Telemetry) -> None:
    recorders = telemetry.recorders()
    streamed = HandlerTable({model: _handler(recorders[model]) for model in STREAMED})
    await bus.watch(
        streamed.subject_filters(),
        streamed,
        stream=TELEMETRY_STREAM.name,
        since=telemetry.replay_from(time.time()),
        name="submit-telemetry",
    )
    for model in LIVE:
        await bus.subscribe_to(model, _handler(recorders[model]))
