"""Watches: an ordered view of some subjects for one process, without a durable (each replica its own), for a
process that keeps a view and re-reads the store for the truth (`Bus.watch`).

A watch sees every event from now on (or since a time), in stream order, and acknowledges none. When its
consumer is lost (a NATS restart, a gap in the sequence, a silence of three heartbeats) it resumes after the
last event it saw. It counts what it handles and how long it took in its bus's `BusMetrics`
(`gpuyard.shared.bus.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from gpuyard.shared.bus.consumers import Handler
from gpuyard.shared.bus.headers import event_id_of
from gpuyard.shared.bus.metrics import FAILED, OK, SKIPPED
from gpuyard.shared.contracts.events.envelope import CloudEvent

if TYPE_CHECKING:
    from gpuyard.shared.bus.jetstream import Bus

log = logging.getLogger(__name__)


class Watch:
    """An ordered view of some subjects for one process: an ephemeral push consumer (no acks, flow control,
    idle heartbeats) that delivers in stream order. When it is lost (a NATS restart, a gap in its sequence, a
    silence of three heartbeats) a new one starts from the stream sequence after the last event
    delivered: a start time or "new" only picks the first event of all."""

    heartbeat = 1.0  # seconds between the server's idle heartbeats
    retry = 0.5  # seconds between tries to start a new consumer while JetStream is not back

    def __init__(
        self,
        bus: Bus,
        stream: str,
        subjects: list[str],
        handler: Handler,
        *,
        since: datetime | None,
        wanted: Callable[[Msg], bool] | None = None,
        name: str | None = None,
        decode: bool = True,
    ):
        self.bus, self.stream, self.subjects, self.handler = bus, stream, subjects, handler
        self.wanted, self.decode = wanted, decode
        self.subject = ",".join(subjects)  # (for the logs)
        self.figures = bus.metrics.consumer(name or f"watch:{self.subject}")
        self.consumer_name: str | None = None
        """The current consumer's name on the server (a new one after each loss)."""
        self.since = since
        self.next_seq: int | None = None  # the stream sequence to go on from, once known
        self.expected = 1  # the consumer sequence of the next event
        self.generation = 0  # which consumer is current: messages of an older one are ignored
        self.sub: Subscription | None = None
        self.active = False
        self.lost = asyncio.Event()

    def _start(self) -> dict:
        if self.next_seq is not None:
            return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": self.next_seq}
        if self.since is not None:
            when = self.since.astimezone(UTC).isoformat().replace("+00:00", "Z")
            return {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": when}
        return {"deliver_policy": DeliverPolicy.NEW}

    async def open(self) -> None:
        """A new consumer, from where the last one stopped."""
        await self.drop()
        self.consumer_name = None
        self.generation += 1
        self.expected, self.active = 1, True
        self.lost.clear()
        generation, inbox = self.generation, self.bus.nc.new_inbox()

        async def delivered(msg: Msg) -> None:
            if generation == self.generation:
                await self._delivered(msg)

        self.sub = await self.bus.nc.subscribe(inbox, cb=delivered)
        config = ConsumerConfig(
            deliver_subject=inbox,
            **(
                {"filter_subject": self.subjects[0]}
                if len(self.subjects) == 1
                else {"filter_subjects": self.subjects}
            ),
            ack_policy=AckPolicy.NONE,
            flow_control=True,
            idle_heartbeat=self.heartbeat,
            inactive_threshold=5 * self.heartbeat,  # the server drops one left behind
            mem_storage=True,
            num_replicas=1,
            **self._start(),
        )
        info = await self.bus.js.add_consumer(self.stream, config)
        self.consumer_name = info.name
        if self.next_seq is None:  # where it starts: after the stream's last event for "new"
            assert info.delivered is not None  # (the server reports it for every consumer it creates)
            self.next_seq = info.delivered.stream_seq + 1

    async def drop(self) -> None:
        sub, self.sub = self.sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def run(self) -> None:
        """Start a new consumer whenever the current one is lost or silent."""
        try:
            while True:
                self.active = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.lost.wait(), 3 * self.heartbeat)
                if not self.lost.is_set() and (self.active or (self.sub and self.sub.pending_msgs)):
                    continue
                log.info(
                    "watch %s: consumer lost, resuming from stream sequence %s", self.subject, self.next_seq
                )
                while True:
                    try:
                        await self.open()
                        break
                    except Exception as exc:  # NATS or JetStream not back yet
                        log.info("watch %s: cannot resume yet: %s", self.subject, exc)
                        await asyncio.sleep(self.retry)
        finally:
            await self.drop()

    async def _delivered(self, msg: Msg) -> None:
        self.active = True
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "100":  # flow control request (answered: everything before it is handled) or heartbeat
            if msg.reply:
                await self.bus.nc.publish(msg.reply)
                return
            if stalled := headers.get("Nats-Consumer-Stalled"):
                await self.bus.nc.publish(stalled)
            last = headers.get("Nats-Last-Consumer")
            if last is not None and int(last) != self.expected - 1:
                self.lost.set()  # events were sent that never arrived
            return
        if status is not None:  # e.g. 409 consumer deleted
            self.lost.set()
            return
        sequence = msg.metadata.sequence
        if sequence.consumer != self.expected:
            self.lost.set()
            return
        self.expected = sequence.consumer + 1
        self.next_seq = sequence.stream + 1
        if self.wanted is not None and not self.wanted(msg):
            self.figures.count(msg.subject, SKIPPED)
            return
        event = None
        if self.decode:
            try:
                event = CloudEvent.from_json(msg.data)
            except (ValidationError, ValueError):
                self.figures.count(msg.subject, FAILED)
                return  # a durable consumer of the same subject dead-letters it
        started = time.perf_counter()
        try:
            await self.handler(event, msg)
        except Exception:
            self.figures.observe(time.perf_counter() - started)
            self.figures.count(msg.subject, FAILED)
            log.exception(
                "watch %s: handler failed on %s", self.subject, event.id if event else event_id_of(msg)
            )
            return
        self.figures.observe(time.perf_counter() - started)
        self.figures.count(msg.subject, OK)
