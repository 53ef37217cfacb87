"""The bus against a real nats-server: de-duplicated publishing, redelivery, dead letters, work sharing.

These cannot be proven with an in-memory broker (acks would be no-ops), so they start the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gpuyard.shared.bus.headers import entity_of
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.jobs import FailureReason, JobCancelled, JobFailed, JobSucceeded
from gpuyard.shared.contracts.events.subjects import DEADLETTER_STREAM, EVENTS_STREAM, STREAMS
from tests.integration.conftest import BIN, free_port, wait_for
from tests.integration.witness import ACK_WITNESS_SECONDS, acknowledged

pytestmark = pytest.mark.integration
TENANT = "t"  # job events are published on job.<kind>.<tenant>


async def connect(url: str, name: str = "test") -> Bus:
    bus = await Bus.connect([url], name=name, source=f"/test/{name}")
    await bus.ensure_streams()
    return bus


def done(job: str):
    return make_event(JobSucceeded(job_id=job, attempt=1), source="/test")


async def eventually(check, within: float = 10):
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - polling a plain predicate
            await asyncio.sleep(0.02)


async def test_a_retried_publish_with_the_same_id_is_dropped(nats_url):
    bus = await connect(nats_url)
    try:
        event = done("a")
        first, second = await bus.publish(event, tenant=TENANT), await bus.publish(event, tenant=TENANT)
        assert not first.duplicate and second.duplicate and second.seq == first.seq
        info = await bus.js.stream_info(EVENTS_STREAM.name)
        assert info.state.messages == 1
        await bus.ensure_streams()  # declaring again at start-up is harmless
    finally:
        await bus.close()


async def test_a_full_stream_drops_its_oldest_messages_and_never_refuses_a_publish(nats_url):
    """The limits (GPUYARD_STREAM_MAX_MSGS / _MAX_BYTES) discard old: a consumer that lags past them goes on
    from the oldest message kept (its service reads what it missed from the event store)."""
    bus = await Bus.connect([nats_url], name="limits", source="/test/limits")
    try:
        await bus.ensure_streams(tuple(s.limited(1 << 20, 3) for s in STREAMS))
        lagging = await bus.js.pull_subscribe("job.succeeded.*", durable="lagging", stream=EVENTS_STREAM.name)
        events = [done(f"j{i}") for i in range(5)]
        for event in events:
            assert not (await bus.publish(event, tenant=TENANT)).duplicate  # accepted, every one
        info = await bus.js.stream_info(EVENTS_STREAM.name)
        assert info.state.messages == 3
        assert (info.config.max_msgs, info.config.max_bytes) == (3, 1 << 20)
        got = await lagging.fetch(5, timeout=2)
        assert [CloudEvent.from_json(m.data).id for m in got] == [e.id for e in events[2:]]
    finally:
        await bus.close()


async def test_a_failed_handler_gets_the_event_again_and_acks_once_it_works(nats_url):
    bus = await connect(nats_url)
    calls: list[str] = []

    async def flaky(event, msg):
        calls.append(event.id)
        if len(calls) < 3:
            raise RuntimeError("transient")

    try:
        await bus.consume("flaky", ["job.>"], flaky, stream=EVENTS_STREAM.name, max_deliver=5)
        event = done("b")
        published = await bus.publish(event, tenant=TENANT)
        await acknowledged(bus, ["flaky"], published.seq)  # acked: JetStream never delivers it again
        assert calls == [event.id] * 3  # acked after the third, and only then
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "flaky")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await bus.close()


async def test_a_poison_event_is_dead_lettered_and_does_not_block_the_consumer(nats_url):
    bus = await connect(nats_url)
    handled: list[str] = []

    async def handler(event, msg):
        if event.subject == "poison":
            raise ValueError("cannot handle this one")
        handled.append(event.subject)

    try:
        await bus.consume("picky", ["job.>"], handler, stream=EVENTS_STREAM.name, max_deliver=2)
        await bus.publish(done("poison"), tenant=TENANT)
        await bus.nc.publish("job.succeeded.t", b"this is not an event")  # unreadable: dead-lettered at once
        await bus.publish(done("fine"), tenant=TENANT)
        await eventually(lambda: "fine" in handled)
        for _ in range(100):
            dlq = await bus.js.stream_info(DEADLETTER_STREAM.name)
            if dlq.state.messages >= 2:
                break
            await asyncio.sleep(0.05)
        assert dlq.state.messages == 2
        letters = [await bus.js.get_msg(DEADLETTER_STREAM.name, s) for s in (1, 2)]
        by_error = {m.headers["Gpuyard-Error"]: m for m in letters}
        poison = next(m for e, m in by_error.items() if "cannot handle" in e)
        assert json.loads(poison.data)["subject"] == "poison"
        assert poison.headers["Gpuyard-Deliveries"] == "2" and poison.headers["Gpuyard-Consumer"] == "picky"
        assert any(e.startswith("unreadable event") for e in by_error)
        assert handled == ["fine"]
    finally:
        await bus.close()


async def test_consumers_sharing_a_durable_share_the_work(nats_url):
    a, b = await connect(nats_url, "a"), await connect(nats_url, "b")
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def handler(name):
        async def handle(event, msg):
            seen[name].append(event.subject)
            await asyncio.sleep(0.01)

        return handle

    try:
        await a.consume("workers", ["job.>"], handler("a"), stream=EVENTS_STREAM.name, batch=4)
        await b.consume("workers", ["job.>"], handler("b"), stream=EVENTS_STREAM.name, batch=4)
        for i in range(40):
            last = await a.publish(done(f"j{i}"), tenant=TENANT)
        await acknowledged(a, ["workers"], last.seq)  # every one handled, and never to be delivered again
        everything = seen["a"] + seen["b"]
        assert sorted(everything) == sorted(f"j{i}" for i in range(40))  # each exactly once
        assert seen["a"] and seen["b"]
    finally:
        await a.close()
        await b.close()


async def test_concurrent_handling_keeps_each_jobs_events_in_order(nats_url):
    bus = await connect(nats_url)
    order: dict[str, list[int]] = {}
    busy, most = 0, 0

    async def handle(event, msg):
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        await asyncio.sleep(0.02 if event.data.attempt == 1 else 0)  # the first of each job is slowest
        order.setdefault(event.subject, []).append(event.data.attempt)
        busy -= 1

    try:
        await bus.consume("parallel", ["job.>"], handle, stream=EVENTS_STREAM.name, concurrency=8)
        for attempt in (1, 2, 3):
            for job in ("x", "y", "z", "w"):
                await bus.publish(
                    make_event(JobSucceeded(job_id=job, attempt=attempt), source="/test"), tenant=TENANT
                )
        await eventually(lambda: sum(map(len, order.values())) == 12)
        assert order == {job: [1, 2, 3] for job in ("x", "y", "z", "w")}
        assert most > 1  # different jobs were handled at the same time
        await acked(bus, "parallel")
    finally:
        await bus.close()


async def test_a_watch_passes_over_unwanted_events_and_goes_on_in_order(nats_url):
    """The serving service's routes read the ends of the replicas they route to, not every job's."""
    bus = await connect(nats_url)
    seen: list[str] = []

    async def handler(event, msg):
        seen.append(event.subject)

    try:
        await bus.watch(
            "job.succeeded.*", handler, stream=EVENTS_STREAM.name, wanted=lambda m: entity_of(m) != "other"
        )
        for job in ("routed", "other", "routed-too"):
            await bus.publish(done(job), tenant=TENANT)
        await eventually(lambda: seen == ["routed", "routed-too"])
    finally:
        await bus.close()


async def test_a_consumer_passes_over_unwanted_events_undecoded_and_acknowledges_them(nats_url):
    """An executor process passes over the ends of attempts it does not hold, told from the job id header."""
    bus = await connect(nats_url)
    handled: list[str] = []
    looked_at: list[str | None] = []

    def wanted(msg) -> bool:
        looked_at.append(entity_of(msg))
        return entity_of(msg) != "elsewhere"

    async def handler(event, msg):
        handled.append(event.subject)

    try:
        await bus.consume("wanting", ["job.>"], handler, stream=EVENTS_STREAM.name, wanted=wanted)
        for job in ("here", "elsewhere", "here-too"):
            await bus.publish(done(job), tenant=TENANT)
        await eventually(lambda: handled == ["here", "here-too"])
        assert looked_at == ["here", "elsewhere", "here-too"]  # the publisher names the job in a header
        await acked(bus, "wanting")  # the one passed over is acknowledged too: never delivered again
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "wanting")
        assert info.num_pending == 0 and info.num_redelivered == 0
    finally:
        await bus.close()


async def test_watch_since_reads_what_was_stored_since_then_and_goes_on_with_what_comes(nats_url):
    """What a service that just started reads to know the nodes at once (the scheduler's heartbeats)."""
    bus = await connect(nats_url)
    old, new, seen_since, seen_now = done("old"), done("new"), [], []

    async def since_handler(event, msg):
        seen_since.append(event.data.job_id)

    async def now_handler(event, msg):
        seen_now.append(event.data.job_id)

    try:
        before = datetime.now(UTC) - timedelta(seconds=5)
        await bus.publish(old, tenant=TENANT)
        await bus.watch("job.succeeded.*", since_handler, stream=EVENTS_STREAM.name, since=before)
        await bus.watch("job.succeeded.*", now_handler, stream=EVENTS_STREAM.name)
        await eventually(lambda: seen_since == ["old"])
        await bus.publish(new, tenant=TENANT)
        await eventually(lambda: seen_since == ["old", "new"] and seen_now == ["new"])
    finally:
        await bus.close()


async def test_a_watch_of_several_subjects_gets_theirs_in_stream_order_and_nothing_else(nats_url):
    """The scheduler follows only the job events it needs, in one ordered consumer."""
    bus = await connect(nats_url)
    seen: list[tuple[str, str]] = []

    async def handler(event, msg):
        seen.append((event.type.rsplit(".", 1)[-1], event.subject))

    try:
        await bus.watch(["job.succeeded.*", "job.cancelled.*"], handler, stream=EVENTS_STREAM.name)
        for data in [
            JobSucceeded(job_id="a", attempt=1),
            JobFailed(job_id="b", attempt=1, reason=FailureReason.EXIT_CODE, message="1"),
            JobCancelled(job_id="c", attempt=1, by="test"),
            JobSucceeded(job_id="d", attempt=1),
        ]:
            await bus.publish(make_event(data, source="/test"), tenant=TENANT)
        await eventually(lambda: ("succeeded", "d") in seen)  # the last one: in stream order, after the rest
        assert seen == [("succeeded", "a"), ("cancelled", "c"), ("succeeded", "d")]
    finally:
        await bus.close()


# ---------------------------------------------------------------------- a consumer whose settings change


async def test_a_durable_with_changed_settings_is_updated_in_place_and_misses_nothing(nats_url):
    """deliver_new=True: a consumer recreated instead of updated would skip what was published meanwhile."""
    bus = await connect(nats_url, "before")
    seen: list[str] = []

    async def handle(event, msg):
        seen.append(event.data.job_id)

    try:
        await bus.consume("changing", ["job.succeeded.*"], handle, stream=EVENTS_STREAM.name, max_deliver=5)
        await bus.publish(done("first"), tenant=TENANT)
        await eventually(lambda: seen == ["first"])
        await acked(bus, "changing")
        created = (await bus.js.consumer_info(EVENTS_STREAM.name, "changing")).created
    finally:
        await bus.close()

    bus = await connect(nats_url, "after")
    try:
        for name in ("while-down-1", "while-down-2"):
            await bus.publish(done(name), tenant=TENANT)
        await bus.consume(
            "changing",
            ["job.succeeded.*", "job.failed.*"],
            handle,
            stream=EVENTS_STREAM.name,
            max_deliver=3,
            ack_wait=20,
        )
        await eventually(lambda: len(seen) == 3)
        assert seen == ["first", "while-down-1", "while-down-2"]
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "changing")
        assert info.created == created  # updated, not recreated
        assert info.config.max_deliver == 3 and info.config.ack_wait == 20
        assert info.config.filter_subjects == ["job.succeeded.*", "job.failed.*"]
    finally:
        await bus.close()


async def test_a_durable_jetstream_cannot_update_is_recreated_after_its_last_ack(nats_url):
    """An ack policy cannot change in place: the new consumer starts after the old one's ack floor."""
    bus = await connect(nats_url)
    seen: list[str] = []

    async def handle(event, msg):
        seen.append(event.data.job_id)

    try:
        old = ConsumerConfig(  # as an older version of the platform left it
            durable_name="legacy",
            filter_subjects=["job.succeeded.*"],
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.NEW,
        )
        await bus.js.add_consumer(EVENTS_STREAM.name, old)
        for name in ("handled-1", "handled-2"):
            await bus.publish(done(name), tenant=TENANT)
        pull = await bus.js.pull_subscribe_bind("legacy", stream=EVENTS_STREAM.name)
        msgs = await pull.fetch(2, timeout=5)
        await msgs[-1].ack_sync()  # ack all: both handled
        await pull.unsubscribe()
        created = (await bus.js.consumer_info(EVENTS_STREAM.name, "legacy")).created
        for name in ("while-down-1", "while-down-2"):
            await bus.publish(done(name), tenant=TENANT)

        await bus.consume("legacy", ["job.succeeded.*"], handle, stream=EVENTS_STREAM.name)
        await eventually(lambda: len(seen) == 2)
        await acked(bus, "legacy")
        assert seen == ["while-down-1", "while-down-2"]
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "legacy")
        assert info.created != created and info.config.ack_policy == AckPolicy.EXPLICIT

        await bus.close()  # the next start finds the recreated consumer as it wants it: left as it is
        bus = await connect(nats_url, "again")
        await bus.consume("legacy", ["job.succeeded.*"], handle, stream=EVENTS_STREAM.name)
        await bus.publish(done("later"), tenant=TENANT)
        await eventually(lambda: len(seen) == 3)
        assert seen[-1] == "later"
        assert (await bus.js.consumer_info(EVENTS_STREAM.name, "legacy")).created == info.created
    finally:
        await bus.close()


async def acked(bus: Bus, durable: str) -> None:
    # acks leave coalesced, a moment after the handler returns
    async with asyncio.timeout(ACK_WITNESS_SECONDS):
        while (await bus.js.consumer_info(EVENTS_STREAM.name, durable)).num_ack_pending:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


# ---------------------------------------------------------------------- a watch across a NATS restart


class NatsServer:
    """A nats-server with JetStream that a test stops and starts again on the same port and store."""

    def __init__(self, store: Path):
        self.store, self.port = store, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                str(BIN / "nats-server"),
                "-js",
                "-sd",
                str(self.store),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def listening():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, 10, what="nats-server")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    if server.proc.poll() is None:
        server.stop()


async def test_a_watch_goes_on_after_nats_restarts(nats_server):
    """The scheduler's heartbeat watch: after a restart it resumes after the last event it saw, by sequence,
    neither stuck on its start time nor replaying the stream from the start."""
    bus = await connect(nats_server.url)
    since, now = [], []

    async def since_handler(event, msg):
        since.append(event.data.job_id)

    async def now_handler(event, msg):
        now.append(event.data.job_id)

    try:
        await bus.publish(done("old"), tenant=TENANT)
        start = datetime.now(UTC) - timedelta(seconds=5)
        await bus.watch("job.succeeded.*", since_handler, stream=EVENTS_STREAM.name, since=start)
        await bus.watch("job.succeeded.*", now_handler, stream=EVENTS_STREAM.name)
        await eventually(lambda: since == ["old"])

        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)
        async with asyncio.timeout(20):
            while True:  # JetStream is back once it stores again; the id keeps a retried publish single
                try:
                    await bus.publish(done("after"), tenant=TENANT)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
        await eventually(lambda: since == ["old", "after"] and now == ["after"], within=20)
        await bus.publish(done("later"), tenant=TENANT)
        await eventually(lambda: since == ["old", "after", "later"] and now == ["after", "later"])
    finally:
        await bus.close()


async def test_a_core_subscription_is_held_when_subscribe_returns_and_comes_back_after_a_restart(nats_server):
    """`Bus.subscribe` returns once the server holds the subscription, so a message published by another
    connection right after it is delivered (the live event stream sends its headers only then); with the server
    away it still returns, and the subscription is made again on reconnection."""
    listener, sender = await connect(nats_server.url), await connect(nats_server.url)
    got: list[bytes] = []

    async def on_msg(msg) -> None:
        got.append(msg.data)

    try:
        for k in range(5):  # each publish leaves before the event loop turns again
            await listener.subscribe(f"node.test{k}", on_msg)
            publish_now(nats_server.url, f"node.test{k}", str(k).encode())
        await eventually(lambda: sorted(got) == [str(k).encode() for k in range(5)])

        await asyncio.to_thread(nats_server.stop)
        async with asyncio.timeout(10):  # (it does not wait for a server that is not there)
            await listener.subscribe("node.later", on_msg)
        await asyncio.to_thread(nats_server.start)
        async with asyncio.timeout(20):
            while b"later" not in got:  # once both have reconnected
                with contextlib.suppress(Exception):
                    await sender.nc.publish("node.later", b"later")
                await asyncio.sleep(0.2)
    finally:
        await listener.close()
        await sender.close()


def publish_now(url: str, subject: str, data: bytes) -> None:
    """Publish from a plain blocking socket, and return once the server has taken it: nothing else of the
    test's event loop runs meanwhile (a subscription still waiting in a client's buffer gets nothing)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock, sock.makefile("rb") as lines:
        lines.readline()  # the server's INFO
        sock.sendall(
            b'CONNECT {"verbose":false}\r\nPUB %s %d\r\n%s\r\nPING\r\n' % (subject.encode(), len(data), data)
        )
        while lines.readline() not in (b"PONG\r\n", b""):
            pass
