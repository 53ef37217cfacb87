"""What the submit service follows on the bus, wired to its telemetry's recorders through handler tables
(`gpuyard.shared.runtime.handlers`): the heartbeats, statuses and samples of the last RECENT_SECONDS read again
from the telemetry stream, then every new one, and node.lost as it comes. A submit service that just started
knows the nodes and services at once, not at their next heartbeat."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

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


def tables(telemetry: Telemetry) -> tuple[HandlerTable, HandlerTable]:
    """The tables of what is read from the telemetry stream, and of what is heard live."""
    recorders = telemetry.recorders()
    streamed = HandlerTable({model: _handler(recorders[model]) for model in STREAMED})
    return streamed, HandlerTable({model: _handler(recorders[model]) for model in LIVE})


def _decoded(table: HandlerTable) -> Callable[[object], Awaitable[None]]:
    """A core NATS callback that hands `table` the event a message holds (one that holds none: nothing)."""

    async def on_msg(msg) -> None:
        with contextlib.suppress(ValueError):
            await table(CloudEvent.from_json(msg.data))

    return on_msg


async def follow(bus: Bus, telemetry: Telemetry) -> None:
    streamed, live = tables(telemetry)
    await bus.watch(
        streamed.subject_filters(),
        streamed,
        stream=TELEMETRY_STREAM.name,
        since=telemetry.replay_from(time.time()),
        name="submit-telemetry",
    )
    for subject in live.subject_filters():
        await bus.subscribe(subject, _decoded(live))
