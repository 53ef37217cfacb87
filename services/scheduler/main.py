"""Wiring of the scheduler service (`service.py`): follow job events, node heartbeats and node controls
(`handlers.py`), then lead when the lease is free, run a cycle after every burst of events and on a timer, and
re-read the live jobs every `resync_interval`.

A node's heartbeats come twice: live, from a plain subscription (core NATS delivers a message to its
subscribers even when the telemetry stream cannot store it: its disk full, a stream that failed a write), and
from the stream, which also gives the last `node_timeout` of them again at start. Each is taken once
(`heartbeats.HeartbeatIntake`), so a node whose heartbeats the stream refuses for longer than `node_timeout`
is not declared lost. Every replica follows the events (an ordered watch each, not a shared durable: the next
leader must not have missed any).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg

from gpuyard.services.scheduler.handlers import FOLLOWED, NODE_CONTROL_EVENTS, SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.bus.headers import ENTITY_HEADER, MSG_ID_HEADER
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, TELEMETRY_STREAM, Subject, job_subject
from gpuyard.shared.runtime.handlers import HandlerTable
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.scheduler import SchedulerSettings

log = logging.getLogger(__name__)


def job_events(handlers: SchedulerHandlers) -> HandlerTable:
    return HandlerTable({FOLLOWED: handlers.on_job_event})


def job_messages(
    table: HandlerTable, job_changed: Callable[[str, str, Subject], None]
) -> Callable[[CloudEvent | None, Msg], Awaitable[None]]:
    """The job events' watch handler. It reads the messages itself, for speed: a job event only says which job
    to read again, and its job, id and kind are in the message's headers and subject, so the watch hands it
    over undecoded (`decode=False`: docs/benchmarks.md, "the scheduler's share of a deep queue"). A message
    without those headers is decoded and goes through `table`."""

    async def on_message(_event: CloudEvent | None, msg: Msg) -> None:  # (None: undecoded)
        headers = msg.headers or {}  # (read once: this runs for every job event)
        job_id, event_id = headers.get(ENTITY_HEADER), headers.get(MSG_ID_HEADER)
        kind = job_subject(msg.subject)
        if job_id and event_id and kind:
            job_changed(job_id, event_id, kind)
            return
        try:
            event = CloudEvent.from_json(msg.data)
        except ValueError:  # (pydantic's ValidationError is one)
            return  # not an event: nothing to read again
        await table(event)

    return on_message


async def follow_heartbeats(service: Service, handlers: SchedulerHandlers, node_timeout: float) -> None:
    """The nodes' heartbeats, live and from the stream (the last `node_timeout` of them again at start)."""
    table = HandlerTable({NodeHeartbeat: handlers.on_heartbeat})
    bus = service.bus
    await bus.subscribe_to(NodeHeartbeat, handlers.on_heartbeat)
    await bus.watch(
        table.subject_filters(),
        table,
        stream=TELEMETRY_STREAM.name,
        since=datetime.now(UTC) - timedelta(seconds=node_timeout),
        name="scheduler-heartbeats",  # (each watch's name in the bus figures of /metrics)
    )


async def follow_events(service: Service, handlers: SchedulerHandlers) -> None:
    """The job events it follows (`handlers.FOLLOWED`), and the node controls."""
    jobs = job_events(handlers)
    bus = service.bus
    await bus.watch(
        jobs.subject_filters(),
        job_messages(jobs, handlers.job_changed),
        stream=EVENTS_STREAM.name,
        name="scheduler-jobs",
        decode=False,  # (it reads the jobs from the event store)
    )
    controls = HandlerTable({NODE_CONTROL_EVENTS: handlers.on_node_control})
    await bus.watch(
        controls.subject_filters(), controls, stream=EVENTS_STREAM.name, name="scheduler-node-controls"
    )


async def main(service: Service, settings: SchedulerSettings) -> None:
    scheduler = SchedulerService(service, settings)
    handlers = SchedulerHandlers(scheduler)
    await follow_heartbeats(service, handlers, settings.node_timeout)
    await follow_events(service, handlers)
    await scheduler.load()
    log.info("following job events (%d live jobs); leading once the lease is free", len(scheduler.view.jobs))
    await scheduler.lease.open()
    service.spawn(scheduler.lease.keep(scheduler.gained, scheduler.lost), "lease")
    service.spawn(scheduler.resync(), "resync")
    await scheduler.run()
