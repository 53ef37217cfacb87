"""`Bus.subscribe_to`: a core-NATS subscription to one event model's subject whose handler gets the typed data
and the envelope, as a HandlerTable's handlers do. A message that holds no such event is dropped and said
once; a handler that fails is said; nothing is raised into nats-py's callback."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from types import SimpleNamespace

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobPlaced
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat, NodeLost

BUS_LOG = "gpuyard.shared.bus.jetstream"


class FakeConnection:
    """What `Bus.subscribe` asks of nats-py's client: the subscription (its callback kept) and a flush."""

    def __init__(self) -> None:
        self.callbacks: dict[str, object] = {}

    def jetstream(self) -> object:
        return object()

    async def subscribe(self, subject: str, cb) -> str:
        self.callbacks[subject] = cb
        return subject

    async def flush(self, **_: float) -> None:  # (its timeout)
        return None


def msg(data: bytes) -> SimpleNamespace:
    return SimpleNamespace(subject="node.lost", data=data, headers=None)


def lost(node: str = "n1"):
    return make_event(NodeLost(node=node, last_seen=datetime(2026, 11, 1, tzinfo=UTC)), source="/test")


async def subscribed(handler, model=NodeLost):
    """The bus over a fake connection, subscribed to `model` with `handler`: (the subject, nats-py's callback)."""
    nc = FakeConnection()
    await Bus(nc, "/test").subscribe_to(model, handler)
    [(subject, callback)] = nc.callbacks.items()
    return subject, callback


async def test_an_event_of_the_model_reaches_the_handler_typed_with_its_envelope():
    seen = []

    async def on_lost(data: NodeLost, event) -> None:
        seen.append((data, event.id))

    subject, deliver = await subscribed(on_lost)
    event = lost()
    await deliver(msg(event.to_json()))
    assert subject == "node.lost"
    assert seen == [(event.data, event.id)] and isinstance(seen[0][0], NodeLost)


async def test_a_job_model_is_subscribed_for_every_tenant():
    async def on_placed(data, event) -> None:
        return None

    subject, _ = await subscribed(on_placed, JobPlaced)
    assert subject == "job.placed.*"


async def test_what_holds_no_event_of_the_model_is_dropped_and_said_once(caplog):
    seen = []

    async def on_lost(data, event) -> None:
        seen.append(data.node)

    _, deliver = await subscribed(on_lost)
    heartbeat = make_event(NodeHeartbeat(node="n2", gpus=[], cpus=1, memory_bytes=1), source="/test")
    with caplog.at_level(logging.WARNING, logger=BUS_LOG):
        for data in (b"not json", b'{"specversion": "1.0"}', heartbeat.to_json()):
            await deliver(msg(data))  # (returns: nothing reaches nats-py)
        await deliver(msg(lost("n1").to_json()))
    said = [r.getMessage() for r in caplog.records if r.name == BUS_LOG]
    assert len(said) == 1 and "subscription node.lost: dropped a message that is not an event" in said[0]
    assert seen == ["n1"]  # (the next good one still comes)


async def test_another_models_event_is_said_by_its_model_when_it_comes_first(caplog):
    async def on_lost(data, event) -> None:
        raise AssertionError("not a NodeLost")

    _, deliver = await subscribed(on_lost)
    heartbeat = make_event(NodeHeartbeat(node="n2", gpus=[], cpus=1, memory_bytes=1), source="/test")
    with caplog.at_level(logging.WARNING, logger=BUS_LOG):
        await deliver(msg(heartbeat.to_json()))
    [said] = [r.getMessage() for r in caplog.records if r.name == BUS_LOG]
    assert "holds a NodeHeartbeat, not a NodeLost" in said


async def test_a_handler_that_fails_is_said_and_the_subscription_goes_on(caplog):
    seen = []

    async def on_lost(data, event) -> None:
        if data.node == "bad":
            raise RuntimeError("boom")
        seen.append(data.node)

    _, deliver = await subscribed(on_lost)
    failing = lost("bad")
    with caplog.at_level(logging.WARNING, logger=BUS_LOG):
        await deliver(msg(failing.to_json()))  # (returns: nothing reaches nats-py)
        await deliver(msg(lost("n1").to_json()))
    [record] = [r for r in caplog.records if r.name == BUS_LOG]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.getMessage() == f"subscription node.lost: handler failed on {failing.id}"
    assert seen == ["n1"]
