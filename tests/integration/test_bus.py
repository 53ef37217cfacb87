"""The bus against a real nats-server: de-duplicated publishing, redelivery, dead letters, work sharing.

These cannot be proven with an in-memory broker (acks would be no-ops), so they start the real server.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from shared.bus import Bus
from shared.events import DEADLETTER_STREAM, EVENTS_STREAM, JobSucceeded, make_event

pytestmark = pytest.mark.integration


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
        first, second = await bus.publish(event), await bus.publish(event)
        assert not first.duplicate and second.duplicate and second.seq == first.seq
        info = await bus.js.stream_info(EVENTS_STREAM.name)
        assert info.state.messages == 1
        await bus.ensure_streams()  # declaring again at start-up is harmless
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
        await bus.publish(event)
        await eventually(lambda: len(calls) >= 3)
        await asyncio.sleep(1.0)
        assert calls == [event.id] * 3  # acked after the third: no fourth delivery
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
        await bus.publish(done("poison"))
        await bus.nc.publish("job.succeeded", b"this is not an event")  # unreadable: dead-lettered at once
        await bus.publish(done("fine"))
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
            await a.publish(done(f"j{i}"))
        await eventually(lambda: len(seen["a"]) + len(seen["b"]) >= 40)
        await asyncio.sleep(0.5)
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
                await bus.publish(make_event(JobSucceeded(job_id=job, attempt=attempt), source="/test"))
        await eventually(lambda: sum(map(len, order.values())) == 12)
        assert order == {job: [1, 2, 3] for job in ("x", "y", "z", "w")}
        assert most > 1  # different jobs were handled at the same time
        async with asyncio.timeout(5):  # acks leave coalesced, a moment after the handlers return
            while (await bus.js.consumer_info(EVENTS_STREAM.name, "parallel")).num_ack_pending:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
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
        await bus.publish(old)
        await bus.watch("job.succeeded", since_handler, stream=EVENTS_STREAM.name, since=before)
        await bus.watch("job.succeeded", now_handler, stream=EVENTS_STREAM.name)
        await eventually(lambda: seen_since == ["old"])
        await bus.publish(new)
        await eventually(lambda: seen_since == ["old", "new"] and seen_now == ["new"])
    finally:
        await bus.close()
