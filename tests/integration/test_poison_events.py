"""Malformed events on the bus (not JSON, not a CloudEvent, an unknown type, data that breaks its schema, a data
version newer than the code) go to the dead letters at once with the reason, and the consumer goes on: the
good event published after each is handled. The watches (the scheduler's, the submit service's queue depth)
skip them and go on too."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSucceeded
from gpuyard.shared.contracts.events.subjects import DEADLETTER_STREAM, EVENTS_STREAM
from tests.integration.test_bus import connect, eventually

pytestmark = pytest.mark.integration


def good(job: str):
    return make_event(JobSucceeded(job_id=job, attempt=1), source="/test")


def envelope(**changes) -> bytes:
    event = json.loads(good("bad").to_json())
    return json.dumps({**event, **changes}).encode()


GARBAGE = [
    ("not JSON", b"\x00\xffnot json at all", "unreadable event"),
    ("JSON, not a CloudEvent", b'{"hello": "world"}', "unreadable event"),
    ("a JSON list", b"[1, 2, 3]", "unreadable event"),
    ("an unknown event type", envelope(type="io.gpuyard.job.exploded"), "unknown event type"),
    ("another system's type", envelope(type="com.example.thing"), "not a GPUYARD event type"),
    ("data breaking its schema", envelope(data={"job_id": "bad", "attempt": "first"}), "attempt"),
    ("a data version from the future", envelope(dataversion=99), "newer than this reader's model"),
]


@pytest.mark.parametrize(("what", "payload", "reason"), GARBAGE, ids=[g[0] for g in GARBAGE])
async def test_garbage_is_dead_lettered_with_its_reason_and_the_consumer_goes_on(
    nats_url, what, payload, reason
):
    bus = await connect(nats_url)
    handled: list[str] = []
    watched: list[str] = []

    async def handler(event, msg):
        handled.append(event.subject)

    async def watcher(event, msg):
        watched.append(event.subject)

    try:
        await bus.consume("strict", ["job.>"], handler, stream=EVENTS_STREAM.name, max_deliver=3)
        await bus.watch("job.>", watcher, stream=EVENTS_STREAM.name)
        await bus.nc.publish("job.succeeded.t", payload)
        await bus.publish(good("after"), tenant="t")
        await eventually(lambda: "after" in handled and "after" in watched)
        for _ in range(100):
            if (await bus.js.stream_info(DEADLETTER_STREAM.name)).state.messages >= 1:
                break
            await asyncio.sleep(0.05)
        letter = await bus.js.get_msg(DEADLETTER_STREAM.name, 1)
        assert letter.data == payload, what
        assert letter.headers["Gpuyard-Consumer"] == "strict"
        assert letter.headers["Gpuyard-Original-Subject"] == "job.succeeded.t"  # kept, tenant and all
        assert reason in letter.headers["Gpuyard-Error"], letter.headers["Gpuyard-Error"]
        assert handled == ["after"] and watched == ["after"]  # nothing else reached either
    finally:
        await bus.close()
