"""The event bus: JetStream streams, de-duplicated publishing, and durable pull consumers that ack only
after the handler's effect is stored.

- Streams (`gpuyard.shared.contracts.events.subjects.STREAMS`) are declared idempotently by every service at start-up.
- `publish` sets `Nats-Msg-Id` to the event id: a retried publish inside the stream's duplicate window is
  dropped by the server. `send` does the same without waiting for the server's ack (a future of it): many
  events in flight, their writes to the socket coalesced.
- `consume` runs a durable pull consumer. Several processes that consume with the same durable name share
  its work. The loop keeps one pull request in flight and hands each message to the handler as soon as it
  arrives (no batching delay). A handler that raises gets the event redelivered with a growing delay; after
  `max_deliver` deliveries the event goes to `deadletter.<durable>` with the error and is terminated, so a
  poison event never blocks the consumer. An event that does not even parse goes there at once.
- `concurrency` > 1 handles up to that many events at once, still one at a time per entity (the CloudEvents
  `subject`, e.g. the job id): events of one job keep their order, different jobs do not wait for each other.
- A durable whose settings changed is updated in place where JetStream allows it (ack_wait, max_deliver,
  max_ack_pending, subjects, description); where it does not (ack policy, max_waiting, ...), it is recreated
  to start right after the last event the old one had acknowledged. Where a consumer starts (`deliver_new`)
  only matters when it is first created: an existing one always goes on from where it is.
- `watch` follows a stream without a durable: an ordered consumer that sees every event from now on (each
  replica its own), for a process that keeps a view and re-reads the store for the truth. It resumes after
  the last event it saw when its consumer is lost (a NATS restart, a gap in the sequence).
- `key_value` opens a KV bucket (the scheduler's leader lease, `gpuyard.shared.runtime.lease`).
- Every consumer and watch counts what it handles, how long it took and how far it is behind in the bus's
  `BusMetrics` (`gpuyard.shared.bus.metrics`): the service's /metrics (`consumer_lags` reads the backlog).

NATS objects stay in this module and `gpuyard.shared.runtime.lease`: services use the methods below, never `nc`/`js`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from gpuyard.shared.bus.credentials import BusCredentials, inbox_prefix
from gpuyard.shared.bus.metrics import (
    DEAD_LETTERED,
    FAILED,
    OK,
    REDELIVERED,
    SKIPPED,
    BusMetrics,
    ConsumerLag,
)
from gpuyard.shared.contracts.events.envelope import CONTENT_TYPE, CloudEvent, subject_of
from gpuyard.shared.contracts.events.jobs import JobPlaced
from gpuyard.shared.contracts.events.subjects import ATTEMPT_STOPS, DEADLETTER_STREAM, STREAMS, StreamDef

log = logging.getLogger(__name__)

Handler = Callable[[CloudEvent | None, Msg], Awaitable[None]]  # (None: a watch with decode=False)

DEADLETTER_PREFIX = "deadletter."
VERSION_HEADER = "Gpuyard-Version"
MSG_ID_HEADER = "Nats-Msg-Id"  # the event's id: JetStream drops a second publish of it (`publish`)
_ATTEMPT_STOP_PREFIXES = tuple(f"{subject.value}." for subject in ATTEMPT_STOPS)
ENTITY_HEADER = "Gpuyard-Entity"  # the event's entity (a job's id): a consumer may pass over it undecoded
HOLDER_HEADER = "Gpuyard-Holder"  # who holds a placement's replicas (JobPlaced.holder), told without a decode
ACK_DELAY = 0.002  # seconds an ack of a handled event waits for others to leave with
ACK_TIMEOUT = 5.0  # seconds without the server's ack after which a sent event counts as not published
CONSUMER_INFO_TIMEOUT = 2.0  # seconds a consumer's info may take to come (the backlog of /metrics)
SUBSCRIBE_FLUSH_SECONDS = 2.0  # most a core subscription waits for the server to confirm it (`Bus.subscribe`)
CONSUMER_CREATE_ERROR = 10012  # JetStream's err_code for a refused consumer, e.g. a change it cannot make
INSUFFICIENT_STORAGE = 10047  # JetStream's err_code for a stream whose max_bytes its disk cannot hold


def version_of(msg: Msg) -> int | None:
    """The store version a message's event was written at, when its publisher said so."""
    value = (msg.headers or {}).get(VERSION_HEADER)
    return int(value) if value and value.isdigit() else None


def entity_of(msg: Msg) -> str | None:
    """The entity (a job's id) of a message's event, when its publisher said so."""
    return (msg.headers or {}).get(ENTITY_HEADER)


def event_id_of(msg: Msg) -> str | None:
    """The id of a message's event, when its publisher said so (`Nats-Msg-Id`, which `Bus.publish` sets)."""
    return (msg.headers or {}).get(MSG_ID_HEADER)


def placed_for(holder: str) -> Callable[[Msg], bool]:
    """`wanted` for a consumer of placements: False for a placement whose replicas another service of the node
    holds (its `Gpuyard-Holder` header), which is then passed over undecoded; a placement without the header
    is decoded."""

    def wanted(msg: Msg) -> bool:
        named = (msg.headers or {}).get(HOLDER_HEADER)
        return named is None or named == holder

    return wanted


def concerns_holder(msg: Msg, holds: Callable[[str], bool]) -> bool:
    """Whether a control event may concern a host of replicas, told from its subject and headers without
    decoding it: an attempt's stop or end (`ATTEMPT_STOPS`) only when `holds(job_id)`; a cancel request
    always (of a job placed on the host and not started yet, too), and so does an event whose publisher did
    not name its job."""
    if not msg.subject.startswith(_ATTEMPT_STOP_PREFIXES):
        return True
    job_id = entity_of(msg)
    return job_id is None or holds(job_id)


class BusUnavailable(Exception):
    """NATS cannot be reached."""


class BusRefused(BusUnavailable):
    """NATS refused the connection: wrong or missing credentials (trying again will not help)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event a consumer gave up on: where it was going, who gave up, why, and the event itself."""

    seq: int
    consumer: str
    original_subject: str
    error: str
    deliveries: int | None
    event: dict | str


@dataclass(frozen=True, slots=True)
class Published:
    stream: str
    seq: int
    duplicate: bool


class Bus:
    def __init__(self, nc: NATS, source: str, *, replicas: int = 1, metrics: BusMetrics | None = None):
        """`metrics`: where its consumers count what they handle (the service's registry); default: a
        registry of its own."""
        # Internal: the connection and its JetStream context, for this module, gpuyard.shared.runtime.lease and tests that
        # look at the server's state. Services use the Bus's methods.
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.source = source
        self.replicas = replicas
        self.metrics = metrics if metrics is not None else BusMetrics()
        self._tasks: list[asyncio.Task] = []
        self._consumers: list[PullConsumer | Watch] = []

    @classmethod
    async def connect(
        cls,
        servers: list[str],
        *,
        name: str,
        source: str,
        replicas: int = 1,
        connect_timeout: float = 5,
        credentials: BusCredentials | None = None,
        tls_ca: Path | None = None,
        metrics: BusMetrics | None = None,
    ) -> Bus:
        """`credentials`: the bus user (gpuyard.shared.bus.credentials), whose replies come to its own inbox prefix;
        `tls_ca`: the CA that signed the servers' certificates (the connection is then TLS); `metrics`: see
        `Bus`."""

        refused: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_error(exc: Exception) -> None:
            if not refused.done() and "authorization violation" in str(exc).lower():
                refused.set_result(exc)  # (nats-py would try again forever: credentials do not improve)
            log.warning("nats: %s", exc)

        auth = {}
        if credentials is not None:
            auth = {
                "user": credentials.user,
                "password": credentials.password,
                "inbox_prefix": inbox_prefix(credentials.user),
            }
        if tls_ca is not None:
            auth["tls"] = ssl.create_default_context(cafile=str(tls_ca))
        connecting = asyncio.ensure_future(
            nats.connect(
                servers=servers,
                name=name,
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=on_error,
                **auth,
            )
        )
        who = f"user {credentials.user!r}" if credentials else "no user (anonymous)"
        try:
            await asyncio.wait({connecting, refused}, return_when=asyncio.FIRST_COMPLETED)
            if not connecting.done():
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
                raise BusRefused(f"NATS at {', '.join(servers)} refused {who}: {refused.result()}")
            nc = connecting.result()
        except BusRefused:
            raise
        except Exception as exc:  # nats raises several unrelated types for "no server"
            if "authorization" in str(exc).lower():
                raise BusRefused(f"NATS at {', '.join(servers)} refused {who}: {exc}") from exc
            raise BusUnavailable(f"cannot reach NATS at {', '.join(servers)}: {exc}") from exc
        return cls(nc, source, replicas=replicas, metrics=metrics)

    # ------------------------------------------------------------------ streams

    async def ensure_streams(self, streams: tuple[StreamDef, ...] = STREAMS) -> None:
        for s in streams:
            config = StreamConfig(
                name=s.name,
                subjects=s.subjects,
                storage=StorageType.FILE,
                max_age=s.max_age_seconds,
                max_bytes=s.max_bytes,
                max_msgs=s.max_msgs,
                discard=DiscardPolicy.OLD,
                duplicate_window=s.duplicate_window_seconds,
                num_replicas=self.replicas,
                description=s.description,
            )
            try:
                try:
                    await self.js.add_stream(config)
                except BadRequestError:
                    await self.js.update_stream(config)  # exists with another shape: bring it to ours
            except APIError as exc:
                if exc.err_code != INSUFFICIENT_STORAGE or not await self._stream_exists(s.name):
                    raise
                # nats-server checks the stream's reservation again against 3/4 of the disk space that was
                # free at its own start: on a fuller disk, an existing stream goes on as it is
                log.warning("stream %s kept as it is: %s", s.name, exc.description)

    async def _stream_exists(self, name: str) -> bool:
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            return False
        return True

    # ------------------------------------------------------------------ publishing

    async def publish(
        self, event: CloudEvent, *, tenant: str | None = None, version: int | None = None
    ) -> Published:
        """`tenant`: the tenant of a job event's job, the last token of its subject (`gpuyard.shared.contracts.events.envelope.subject_of`;
        a job.submitted event names it itself). `version`: the event's position in its entity's stream in the
        event store, sent as the `Gpuyard-Version` header so that a reader holding the previous version can
        apply it without a read."""
        ack = await self.js.publish(
            subject_of(event, tenant), event.to_json(), headers=self._headers(event, version)
        )
        return Published(ack.stream, ack.seq, bool(ack.duplicate))

    async def send(
        self,
        event: CloudEvent,
        *,
        tenant: str | None = None,
        version: int | None = None,
        ack_within: float = ACK_TIMEOUT,
    ) -> asyncio.Future:
        """`publish` without waiting for the server: returns once the event is on its way, with a future of the
        server's ack (`.seq`, `.duplicate`), failed with TimeoutError after `ack_within` seconds without one.
        Many sends are in flight at once and their writes to the socket coalesce; the stream stores them in
        the order they were sent."""
        ack = await self.js.publish_async(
            subject_of(event, tenant), event.to_json(), headers=self._headers(event, version)
        )

        def expire() -> None:
            if not ack.done():
                ack.set_exception(TimeoutError(f"no ack for {event.type} {event.id} within {ack_within:g}s"))

        expiry = asyncio.get_running_loop().call_later(ack_within, expire)
        ack.add_done_callback(lambda _: expiry.cancel())
        return ack

    @staticmethod
    def _headers(event: CloudEvent, version: int | None) -> dict[str, str]:
        headers = {MSG_ID_HEADER: event.id, "Content-Type": CONTENT_TYPE}
        if event.subject:
            headers[ENTITY_HEADER] = event.subject
        if version is not None:
            headers[VERSION_HEADER] = str(version)
        if isinstance(event.data, JobPlaced):
            headers[HOLDER_HEADER] = event.data.holder
        return headers

    # ------------------------------------------------------------------ consuming

    async def consume(
        self,
        durable: str,
        subjects: list[str],
        handler: Handler,
        *,
        stream: str,
        max_deliver: int = 5,
        ack_wait: float = 30,
        batch: int = 256,
        deliver_new: bool = True,
        concurrency: int = 1,
        wanted: Callable[[Msg], bool] | None = None,
    ) -> asyncio.Task:
        """Create (or join) the durable consumer and start handling its events in a background task.
        `wanted(msg)`: False for an event the handler would do nothing with, told from its subject and
        headers (`entity_of`) before it is decoded; such an event is acknowledged without a decode, unless an
        earlier event of the same entity is still being handled (then it goes to the handler, in order)."""
        config = ConsumerConfig(
            durable_name=durable,
            filter_subjects=subjects,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=batch * 4,
            deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
        )
        await self.declare_consumer(stream, config)
        consumer = PullConsumer(
            self,
            stream,
            durable,
            handler,
            max_deliver=max_deliver,
            batch=batch,
            concurrency=concurrency,
            wanted=wanted,
        )
        self._consumers.append(consumer)
        task = asyncio.create_task(consumer.run(), name=f"consume:{durable}")
        self._tasks.append(task)
        return task

    async def declare_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        """Create the durable `config` names, or bring the existing one to `config` without skipping an event.

        JetStream updates an existing consumer in place when it is created again with another configuration,
        for the fields it can change (ack_wait, max_deliver, max_ack_pending, filter_subjects, description,
        ...); it refuses the others (deliver policy, start sequence or time, ack policy, max_waiting, ...)
        with err_code 10012. The start position is taken from the existing consumer, since it only matters at
        creation. For any other refused change the consumer is recreated from its acknowledged position:
        nothing published while it was down or not yet acknowledged is skipped (redelivered at worst)."""
        durable = config.durable_name
        try:
            old = await self.js.consumer_info(stream, durable)
        except NotFoundError:
            return await self.js.add_consumer(stream, config)
        try:
            return await self.js.add_consumer(
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
            await self.js.delete_consumer(stream, durable)
        return await self.js.add_consumer(
            stream, config.evolve(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        )

    async def watch(
        self,
        subject: str | Sequence[str],
        handler: Handler,
        *,
        stream: str,
        since: datetime | None = None,
        wanted: Callable[[Msg], bool] | None = None,
        name: str | None = None,
        decode: bool = True,
    ) -> None:
        """Every event on `subject` (a filter, or several) from now on (or stored `since` then), in order, to
        this process alone (no acks, no durable). Goes on after a NATS restart from the event after the last
        one it saw. `wanted(msg)`: False for an event the handler would do nothing with (told from its subject
        and headers: `entity_of`), which is then passed over without a decode. `decode=False`: the handler
        gets None for the event and reads what it needs from the message (`entity_of`, `event_id_of`), for a
        handler that takes its facts from the event store anyway. `name`: the watch's `consumer` label in the
        bus figures (default: `watch:` and its subjects)."""
        subjects = [subject] if isinstance(subject, str) else list(subject)
        watch = Watch(self, stream, subjects, handler, since=since, wanted=wanted, name=name, decode=decode)
        try:
            await watch.open()
        except BaseException:
            await watch.drop()
            raise
        self._consumers.append(watch)
        task = asyncio.create_task(watch.run(), name=f"watch:{watch.subject}")
        self._tasks.append(task)

    async def consumer_lags(self) -> list[ConsumerLag]:
        """The backlog of each of this process's consumers and watches, from JetStream's consumer info; one
        whose info cannot be read now (NATS away, a watch between two consumers) is left out."""
        lags = []
        for consumer in list(self._consumers):
            name = consumer.consumer_name
            if name is None:
                continue
            try:
                info = await self.js.consumer_info(consumer.stream, name, timeout=CONSUMER_INFO_TIMEOUT)
            except Exception as exc:  # whatever it is, the figure is unknown for now
                log.debug("consumer %s: no consumer info: %s", consumer.figures.name, exc)
                continue
            lags.append(
                ConsumerLag(
                    consumer.figures.name,
                    consumer.stream,
                    info.num_pending or 0,
                    info.num_ack_pending or 0,
                    info.num_redelivered or 0,
                )
            )
        return lags

    async def dead_letter(self, msg: Msg, durable: str, error: str) -> None:
        headers = {
            "Content-Type": (msg.headers or {}).get("Content-Type", CONTENT_TYPE),
            "Gpuyard-Original-Subject": msg.subject,
            "Gpuyard-Consumer": durable,
            "Gpuyard-Error": error[:2000].replace("\r", " ").replace("\n", " "),
        }
        with contextlib.suppress(Exception):
            headers["Gpuyard-Stream-Seq"] = str(msg.metadata.sequence.stream)
            headers["Gpuyard-Deliveries"] = str(msg.metadata.num_delivered)
        await self.js.publish(DEADLETTER_PREFIX + durable, msg.data, headers=headers)

    # ------------------------------------------------------------------ key-value buckets

    async def key_value(self, config: KeyValueConfig) -> KeyValue:
        """The KV bucket `config` names: created with `config`, or as it is when it exists with other settings
        (the first replica's settings win)."""
        try:
            return await self.js.create_key_value(config)
        except BadRequestError:
            return await self.js.key_value(config.bucket)

    # ------------------------------------------------------------------ plain subscriptions, dead letters

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Subscription:
        """Core NATS: every message on `subject` from now on, to this process alone, not stored, not acked
        (heartbeats, live views). Unsubscribe with `await sub.unsubscribe()`. Returns once the server holds
        the subscription (two round trips): a message published after that reaches `cb`. With the server away
        it returns within twice SUBSCRIBE_FLUSH_SECONDS: the client subscribes again when it reconnects."""
        sub = await self.nc.subscribe(subject, cb=cb)
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            # nats-py writes a flush's PING ahead of what is still buffered (this SUB): the first round trip
            # sends the SUB out, the second one's PONG comes after the server has taken it
            for _ in range(2):
                await self.nc.flush(timeout=SUBSCRIBE_FLUSH_SECONDS)
        return sub

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The newest dead letters first, at most `limit`, each with the consumer, subject and error."""
        info = await self.js.stream_info(DEADLETTER_STREAM.name)
        out: list[DeadLetter] = []
        seq = info.state.last_seq
        while seq >= max(info.state.first_seq, 1) and len(out) < limit:
            try:
                msg = await self.js.get_msg(DEADLETTER_STREAM.name, seq)
            except NotFoundError:  # deleted or expired in between
                seq -= 1
                continue
            headers = msg.headers or {}
            try:
                body: dict | str = json.loads(msg.data)
            except (ValueError, TypeError):
                body = (msg.data or b"").decode(errors="replace")
            deliveries = headers.get("Gpuyard-Deliveries", "")
            out.append(
                DeadLetter(
                    seq=seq,
                    consumer=headers.get("Gpuyard-Consumer", ""),
                    original_subject=headers.get("Gpuyard-Original-Subject", ""),
                    error=headers.get("Gpuyard-Error", ""),
                    deliveries=int(deliveries) if deliveries.isdigit() else None,
                    event=body,
                )
            )
            seq -= 1
        return out

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._consumers.clear()
        with contextlib.suppress(Exception):
            await self.nc.drain()


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


async def publish_recorded(bus, event: CloudEvent, store, *, version: int | None = None) -> bool:
    """Publish an event the event store `store` already holds (None: none does), and mark it published there.
    A failure is said and left to the outbox relay, which publishes what stays unmarked. True once published."""
    try:
        await (bus.publish(event) if version is None else bus.publish(event, version=version))
        if store is not None:
            await store.mark_published([event.id])
    except Exception as exc:
        log.warning("publish of %s %s failed, left to the outbox relay: %s", event.type, event.id, exc)
        return False
    return True
