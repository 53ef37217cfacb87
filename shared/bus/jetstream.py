"""The event bus, one per service: its connection to NATS, the JetStream streams, de-duplicated publishing, and
the consumers and watches it runs.

- Streams (`gpuyard.shared.contracts.events.subjects.STREAMS`) are declared idempotently by every service at start-up.
- `publish` sets `Nats-Msg-Id` to the event id: a retried publish inside the stream's duplicate window is
  dropped by the server. `send` does the same without waiting for the server's ack (a future of it): many
  events in flight, their writes to the socket coalesced. The headers it writes (`gpuyard.shared.bus.headers`)
  let a consumer pass over an event without decoding it.
- `consume` runs a durable pull consumer that acks only after the handler's effect is stored, redelivers and
  dead-letters (`gpuyard.shared.bus.consumers`). Where a consumer starts (`deliver_new`) only matters when it
  is first created: an existing one always goes on from where it is.
- `watch` follows a stream without a durable: an ordered consumer that sees every event from now on (each
  replica its own), resuming after the last event it saw when its consumer is lost
  (`gpuyard.shared.bus.watches`).
- `subscribe` is a plain core-NATS subscription (live, not stored, not acknowledged); `subscribe_to` one that
  hands over the typed data and envelope of one event model's events, as a `HandlerTable`'s handlers get them
  (`decoding`).
- `key_value` opens a KV bucket (the scheduler's leader lease, `gpuyard.shared.runtime.lease`).
- Every consumer and watch counts what it handles, how long it took and how far it is behind in the bus's
  `BusMetrics` (`gpuyard.shared.bus.metrics`): the service's /metrics (`consumer_lags` reads the backlog).

NATS objects stay in `gpuyard.shared.bus` and `gpuyard.shared.runtime.lease`: services use the Bus's methods,
never `nc`/`js`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from gpuyard.shared.bus.busstate import BusState
from gpuyard.shared.bus.consumers import Handler, PullConsumer, declare_durable
from gpuyard.shared.bus.credentials import BusCredentials, inbox_prefix
from gpuyard.shared.bus.deadletters import DeadLetter, read_dead_letters, send_dead_letter
from gpuyard.shared.bus.headers import ENTITY_HEADER, HOLDER_HEADER, MSG_ID_HEADER, VERSION_HEADER
from gpuyard.shared.bus.metrics import BusMetrics, ConsumerLag
from gpuyard.shared.bus.watches import Watch
from gpuyard.shared.contracts.events.envelope import CONTENT_TYPE, CloudEvent, EventData, subject_of
from gpuyard.shared.contracts.events.jobs import JobPlaced
from gpuyard.shared.contracts.events.subjects import STREAMS, StreamDef, subject_filter

log = logging.getLogger(__name__)

ACK_TIMEOUT = 5.0  # seconds without the server's ack after which a sent event counts as not published
CONSUMER_INFO_TIMEOUT = 2.0  # seconds a consumer's info may take to come (the backlog of /metrics)
SUBSCRIBE_FLUSH_SECONDS = 2
"""Most a core subscription waits for the server to confirm it (`Bus.subscribe`), in whole seconds, as nats-py's
`flush` takes them."""
INSUFFICIENT_STORAGE = 10047  # JetStream's err_code for a stream whose max_bytes its disk cannot hold

M = TypeVar("M", bound=EventData)


class BusUnavailable(Exception):
    """NATS cannot be reached."""


class BusRefused(BusUnavailable):
    """NATS refused the connection: wrong or missing credentials (trying again will not help)."""


@dataclass(frozen=True, slots=True)
class Published:
    stream: str
    seq: int
    duplicate: bool


class Bus:
    def __init__(
        self,
        nc: NATS,
        source: str,
        *,
        replicas: int = 1,
        metrics: BusMetrics | None = None,
        state: BusState | None = None,
    ):
        """`replicas`: of each stream it declares (3 on a 3-server cluster); `metrics`: where its consumers count
        what they handle (the service's registry), default: a registry of its own; `state`: what its connection
        goes through (`connect` makes it, told by nats-py's callbacks), for /readyz."""
        # Internal: the connection and its JetStream context, for gpuyard.shared.bus (its consumers and watches),
        # gpuyard.shared.runtime.lease and tests that look at the server's state. Services use the Bus's methods.
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.source = source
        self.replicas = replicas
        self.metrics = metrics if metrics is not None else BusMetrics()
        self.state = state if state is not None else BusState()
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
        """`servers`: every server of the bus (any one of them will do; on a clustered bus, the client moves to
        another when its server is lost); `credentials`: the bus user (gpuyard.shared.bus.credentials), whose
        replies come to its own inbox prefix; `tls_ca`: the CA that signed the servers' certificates (the
        connection is then TLS); `metrics`: see `Bus`."""

        refused: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_error(exc: Exception) -> None:
            if not refused.done() and "authorization violation" in str(exc).lower():
                refused.set_result(exc)  # (nats-py would try again forever: credentials do not improve)
            log.warning("nats: %s", exc)

        state = BusState()
        holder: list[NATS] = []  # (the client, once connected: the callbacks name its server)

        async def on_disconnect() -> None:
            state.disconnected()

        async def on_reconnect() -> None:
            state.reconnected(_server_of(holder))

        auth: dict[str, Any] = {}
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
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
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
        holder.append(nc)
        state.connected(_server_of(holder))
        return cls(nc, source, replicas=replicas, metrics=metrics, state=state)

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
        try:
            ack = await self.js.publish(
                subject_of(event, tenant), event.to_json(), headers=self._headers(event, version)
            )
        except Exception as exc:
            self.state.publish_failed(exc)
            raise
        self.state.published()
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
        state = self.state

        def done(future: asyncio.Future) -> None:
            expiry.cancel()
            if future.cancelled():
                return
            if (exc := future.exception()) is not None:
                state.publish_failed(exc)
            elif state.trouble is not None:
                state.published()

        ack.add_done_callback(done)
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
        await declare_durable(self.js, stream, config)
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
        """Give `msg`'s event up: to `deadletter.<durable>` (`gpuyard.shared.bus.deadletters`)."""
        await send_dead_letter(self.js, msg, durable, error)

    # ------------------------------------------------------------------ key-value buckets

    async def key_value(self, config: KeyValueConfig) -> KeyValue:
        """The KV bucket `config` names: created with `config`, or as it is when it exists with other settings
        (the first replica's settings win)."""
        try:
            return await self.js.create_key_value(config)
        except BadRequestError:
            return await self.js.key_value(config.bucket)

    # ------------------------------------------------------------------ plain subscriptions

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

    async def subscribe_to(
        self, model: type[M], handler: Callable[[M, CloudEvent], Awaitable[None]]
    ) -> Subscription:
        """`subscribe` to `model`'s events (every tenant's, for a job event): `handler` gets the typed data and
        the envelope of each, as a `HandlerTable`'s handlers do; what is not one is dropped (`decoding`)."""
        subject = subject_filter(model.subject)
        return await self.subscribe(subject, decoding(model, handler, subject))

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The newest dead letters first, at most `limit`, each with the consumer, subject and error."""
        return await read_dead_letters(self.js, limit)

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


def _server_of(holder: list[NATS]) -> str | None:
    """The server the client is (or was last) connected to, as `nats://host:port`."""
    url = holder[0].connected_url if holder else None
    return f"{url.scheme}://{url.hostname}:{url.port}" if url is not None else None


def decoding(
    model: type[M], handler: Callable[[M, CloudEvent], Awaitable[None]], subject: str
) -> Callable[[Msg], Awaitable[None]]:
    """The core-NATS callback of a subscription to `subject` that hands `handler` the data and envelope of each
    message that holds a `model` event. One that does not (not JSON, not an event, another model's) is dropped,
    said once for the subscription (a publisher that sends such messages would otherwise fill the log); one the
    handler fails on is said, with its traceback. Nothing is raised to nats-py."""
    said = False

    async def on_message(msg: Msg) -> None:
        nonlocal said
        try:
            event = CloudEvent.from_json(msg.data)
        except ValueError as exc:  # (pydantic's ValidationError is one)
            why = f"is not an event: {_first_error(exc)}"
        else:
            data = event.data
            if isinstance(data, model):
                try:
                    await handler(data, event)
                except Exception:
                    log.exception("subscription %s: handler failed on %s", subject, event.id)
                return
            why = f"holds a {type(data).__name__}, not a {model.__name__}"
        if not said:
            said = True
            log.warning("subscription %s: dropped a message that %s (said once)", subject, why)

    return on_message


def _first_error(exc: ValueError) -> str:
    """What is wrong, in a line: a ValidationError's first error (its text spans several lines)."""
    said = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) and exc.errors() else str(exc)
    return (said or type(exc).__name__)[:200]
