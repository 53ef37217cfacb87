"""Durable pull consumers: each event handed to its handler as soon as it arrives, and acknowledged only
after the handler returned (its effect stored).

- Several processes that consume with the same durable name share its work. The loop keeps one pull request
  in flight and hands each message to the handler as soon as it arrives (no batching delay).
- A handler that raises gets the event redelivered with a growing delay; after `max_deliver` deliveries the
  event goes to `deadletter.<durable>` (`gpuyard.shared.bus.deadletters`) with the error and is terminated,
  so a poison event never blocks the consumer. An event that does not even parse goes there at once.
- `concurrency` > 1 handles up to that many events at once, still one at a time per entity (the CloudEvents
  `subject`, e.g. the job id): events of one job keep their order, different jobs do not wait for each other.
- A durable whose settings changed is updated in place where JetStream allows it, and recreated from its
  acknowledged position where it does not (`declare_durable`).
- Each consumer counts what it handles and how long it took in its bus's `BusMetrics`
  (`gpuyard.shared.bus.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError

from gpuyard.shared.bus.headers import entity_of
from gpuyard.shared.bus.metrics import DEAD_LETTERED, OK, REDELIVERED, SKIPPED
from gpuyard.shared.contracts.events.envelope import CloudEvent

if TYPE_CHECKING:
    from gpuyard.shared.bus.jetstream import Bus

log = logging.getLogger(__name__)

Handler = Callable[[CloudEvent | None, Msg], Awaitable[None]]
"""What a consumer or a watch hands each event to, with its message (None for the event: a watch with
`decode=False`). A `gpuyard.shared.runtime.handlers.HandlerTable` is one."""

ACK_DELAY = 0.002  # seconds an ack of a handled event waits for others to leave with
CONSUMER_CREATE_ERROR = 10012  # JetStream's err_code for a refused consumer, e.g. a change it cannot make


async def declare_durable(js: JetStreamContext, stream: str, config: ConsumerConfig) -> ConsumerInfo:
    """Create the durable `config` names, or bring the existing one to `config` without skipping an event.

    JetStream updates an existing consumer in place when it is created again with another configuration,
    for the fields it can change (ack_wait, max_deliver, max_ack_pending, filter_subjects, description,
    ...); it refuses the others (deliver policy, start sequence or time, ack policy, max_waiting, ...)
    with err_code 10012. The start position is taken from the existing consumer, since it only matters at
    creation. For any other refused change the consumer is recreated from its acknowledged position:
    nothing published while it was down or not yet acknowledged is skipped (redelivered at worst)."""
    durable = config.durable_name
    if durable is None:
        raise ValueError("declare_durable needs a durable consumer (config.durable_name)")
    try:
        old = await js.consumer_info(stream, durable)
    except NotFoundError:
        return await js.add_consumer(stream, config)
    try:
        return await js.add_consumer(
            stream,
            config.evolve(
                deliver_policy=old.config.deliver_policy,
                opt_start_seq=old.config.opt_start_seq,
                opt_start_time=old.config.opt_start_time,
            ),
        )
    except APIError as exc:
        if exc.err_code != CONSUMER_CREATE_ERROR:
            raise
        refused = exc.description
    start = old.ack_floor.stream_seq + 1
    log.warning("consumer %s: %s; recreating it from stream sequence %d", durable, refused, start)
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(stream, durable)
    return await js.add_consumer(
        stream, config.evolve(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
    )


class PullConsumer:
    """One durable pull consumer: one pull request in flight, each message handled as soon as it arrives
    (up to `concurrency` at once, in order per entity)."""

    expires = 5.0
    heartbeat = 1.0

    def __init__(
        self,
        bus: Bus,
        stream: str,
        durable: str,
        handler: Handler,
        *,
        max_deliver: int,
        batch: int,
        concurrency: int = 1,
        wanted: Callable[[Msg], bool] | None = None,
    ):
        self.bus, self.stream, self.durable, self.handler = bus, stream, durable, handler
        self.consumer_name: str | None = durable
        self.figures = bus.metrics.consumer(durable)
        self.wanted = wanted
        self.max_deliver = max_deliver
        self.batch = batch
        self.slots = asyncio.Semaphore(max(1, concurrency))
        self.concurrent = concurrency > 1
        self.chains: dict[str | None, asyncio.Task] = {}  # entity -> its latest handling task
        self.remaining = batch
        self.request_over = asyncio.Event()
        self.pause = 0.0
        self.acks: list[Msg] = []
        self.ack_flush: asyncio.TimerHandle | None = None
        self.ack_tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        nc = self.bus.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=self._delivered)
        api = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}"
        request = json.dumps(
            {
                "batch": self.batch,
                "expires": int(self.expires * 1e9),
                "idle_heartbeat": int(self.heartbeat * 1e9),
            }
        ).encode()
        try:
            while True:
                self.remaining = self.batch
                self.request_over.clear()
                await nc.publish(api, request, reply=inbox)
                with contextlib.suppress(TimeoutError):  # no end in sight: the request was lost (reconnect)
                    await asyncio.wait_for(self.request_over.wait(), self.expires + 2 * self.heartbeat)
                if self.pause:
                    await asyncio.sleep(self.pause)
                    self.pause = 0.0
        finally:
            for task in list(self.chains.values()):
                task.cancel()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _delivered(self, msg: Msg) -> None:
        """Each message of the pull request's answer, in order: events, idle heartbeats, and the status that
        ends the request (then `run` asks again)."""
        status = (msg.headers or {}).get("Status")
        if status == "100":
            return  # idle heartbeat
        if status is not None:
            if status not in ("404", "408"):
                log.info("consumer %s: status %s %s", self.durable, status, msg.headers)
                self.pause = 0.5
            self.request_over.set()
            return
        self.remaining -= 1
        if self.remaining <= 0:
            self.request_over.set()
        await self.dispatch(msg)

    def _ack(self, msg: Msg) -> None:
        """Acks leave together a moment later: one write to the socket for the events handled meanwhile
        (an ack only stops redelivery, so a millisecond's delay changes nothing else)."""
        self.acks.append(msg)
        if self.ack_flush is None:
            self.ack_flush = asyncio.get_running_loop().call_later(ACK_DELAY, self._send_acks)

    def _send_acks(self) -> None:
        acks, self.acks, self.ack_flush = self.acks, [], None
        task = asyncio.create_task(self._publish_acks(acks))
        self.ack_tasks.add(task)
        task.add_done_callback(self.ack_tasks.discard)

    async def _publish_acks(self, acks: list[Msg]) -> None:
        for msg in acks:
            try:
                await msg.ack()
            except Exception as exc:  # not acked: redelivered after ack_wait, and handled idempotently
                log.warning("consumer %s: ack failed: %s", self.durable, exc)

    async def dispatch(self, msg: Msg) -> None:
        if self.wanted is not None and not self.wanted(msg) and entity_of(msg) not in self.chains:
            self.figures.count(msg.subject, SKIPPED)
            self._ack(msg)  # nothing to do with it: no decode
            return
        event = await self.parse(msg)
        if event is None:
            return
        if not self.concurrent:
            await self.handle(event, msg)
            return
        await self.slots.acquire()
        key = event.subject
        task = asyncio.create_task(self._handle_after(self.chains.get(key), event, msg))
        self.chains[key] = task

        def done(t: asyncio.Task, key=key) -> None:
            self.slots.release()
            if self.chains.get(key) is t:
                del self.chains[key]

        task.add_done_callback(done)

    async def _handle_after(self, previous: asyncio.Task | None, event: CloudEvent, msg: Msg) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # its outcome is its own; only the order matters here
        await self.handle(event, msg)

    async def parse(self, msg: Msg) -> CloudEvent | None:
        try:
            return CloudEvent.from_json(msg.data)
        except (ValidationError, ValueError) as exc:
            log.error(
                "consumer %s: unreadable event on %s, dead-lettered: %s", self.durable, msg.subject, exc
            )
            self.figures.count(msg.subject, DEAD_LETTERED)
            await self.bus.dead_letter(msg, self.durable, f"unreadable event: {exc}")
            await msg.term()
            return None

    async def handle(self, event: CloudEvent, msg: Msg) -> None:
        started = time.perf_counter()
        try:
            await self.handler(event, msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.figures.observe(time.perf_counter() - started)
            delivered = msg.metadata.num_delivered
            if delivered >= self.max_deliver:
                log.exception(
                    "consumer %s: %s %s failed %d times, dead-lettered",
                    self.durable,
                    event.type,
                    event.id,
                    delivered,
                )
                self.figures.count(msg.subject, DEAD_LETTERED)
                await self.bus.dead_letter(msg, self.durable, f"{type(exc).__name__}: {exc}")
                await msg.term()
            else:
                log.warning(
                    "consumer %s: %s %s failed (delivery %d): %s",
                    self.durable,
                    event.type,
                    event.id,
                    delivered,
                    exc,
                )
                self.figures.count(msg.subject, REDELIVERED)
                await msg.nak(delay=min(0.2 * 2**delivered, 10))
            return
        self.figures.observe(time.perf_counter() - started)
        self.figures.count(msg.subject, OK)
        self._ack(msg)
