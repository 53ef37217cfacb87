"""Loops that write on a timer say once that their writes fail (the store's disk full, its lock held, the store
away), not at every try, and once that they succeed again: the outbox relay (every half second) and the
monitor's GPU history writer. What the relay could not mark published is marked once the store writes again;
the history keeps its samples for the next try."""

from __future__ import annotations

import logging

import pytest

from gpuyard.services.monitor.history import HistoryWriter
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSucceeded
from gpuyard.shared.contracts.events.nodes import GpuSample
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.stores import ledger as ledger_module
from gpuyard.shared.stores.events import Outage, StoreBusy, StoreFull, StoreUnavailable
from gpuyard.shared.stores.gpuhistory.base import Compacted
from gpuyard.shared.stores.ledger import JobLedger
from tests.unit.services.monitor.gpureadings import reading

TRIES = 20  # ten seconds of a relay's turns


class FullStore:
    """The store's part the outbox relay uses; its writes raise `refusal` while it is set."""

    def __init__(self) -> None:
        self.refusal: Exception | None = StoreFull("the event store cannot write: its disk is full")
        self.marked: list[str] = []
        self.pending: list = []

    async def mark_published(self, event_ids: list[str]) -> None:
        if event_ids and self.refusal is not None:
            raise self.refusal
        self.marked += event_ids

    async def unpublished(self, *, older_than: float, limit: int = 500):
        return list(self.pending)

    async def get_projection(self, job_id: str) -> dict:
        return {"tenant": "vision"}  # (the relay's subject ends with the job's tenant)


class RelayBus:
    def __init__(self) -> None:
        self.relayed: list[str] = []

    async def publish(self, event, *, tenant=None, version=None):
        self.relayed.append(event.id)


def said(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


def done(job: str):
    return make_event(JobSucceeded(job_id=job, attempt=1), source="/test")


async def test_the_outbox_relay_says_once_that_the_store_is_full_then_that_it_resumed(caplog):
    caplog.set_level(logging.INFO, logger=ledger_module.__name__)
    store, bus = FullStore(), RelayBus()
    ledger = JobLedger(store, bus, "/test")
    ledger._published = ["acked-1", "acked-2"]  # acknowledged by JetStream, to be marked in the store
    for _ in range(TRIES):
        await ledger.relay_once(grace=0)
    lines = said(caplog, ledger_module.__name__)
    assert len(lines) == 1 and lines[0].startswith(
        "outbox relay: the event store cannot write: its disk is full"
    )
    assert ledger.relay_outage.failures == TRIES

    store.refusal = None  # space again
    event = done("j1")
    store.pending = [event]
    await ledger.relay_once(grace=0)
    assert store.marked == ["acked-1", "acked-2", event.id] and bus.relayed == [event.id]  # nothing lost
    lines = said(caplog, ledger_module.__name__)
    assert len(lines) == 2 and lines[1].startswith(
        f"outbox relay: resumed, after 0 s and {TRIES} failed tries"
    )
    store.pending = []
    await ledger.relay_once(grace=0)  # nothing to write: nothing to say
    assert len(said(caplog, ledger_module.__name__)) == 2


async def test_a_relay_turn_with_nothing_to_write_does_not_end_an_outage(caplog):
    caplog.set_level(logging.INFO, logger=ledger_module.__name__)
    store = FullStore()
    ledger = JobLedger(store, RelayBus(), "/test")
    ledger._published = ["acked"]
    await ledger.relay_once(grace=0)
    store.refusal = None
    ledger._published, kept = [], ledger._published  # (as if nothing were left to mark)
    await ledger.relay_once(grace=0)
    assert ledger.relay_outage.failing and len(said(caplog, ledger_module.__name__)) == 1
    assert kept == ["acked"]


def test_an_outage_says_each_kind_of_failure_once():
    log = logging.getLogger("test.outage")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Keep()
    log.addHandler(handler)
    try:
        clock = iter(range(100)).__next__
        outage = Outage(log, "writing", clock=lambda: float(clock()))
        for _ in range(5):
            outage.failed(StoreFull("the disk is full"))
            outage.failed(StoreBusy("another writer held its lock"))
        outage.failed(ConnectionError("bus away"))
        outage.succeeded()
        outage.succeeded()  # (not failing: nothing more to say)
    finally:
        log.removeHandler(handler)
    assert lines[:3] == [
        "writing: the disk is full; tried again as before, and said again once it works (said once until then)",
        "writing: another writer held its lock; tried again as before, and said again once it works (said once "
        "until then)",
        "writing: bus away; tried again as before, and said again once it works (said once until then)",
    ]
    assert lines[3:] == ["writing: resumed, after 1 s and 11 failed tries"] and not outage.failing


class FailingHistory:
    """A GPU history whose writes raise while `refusal` is set."""

    def __init__(self) -> None:
        self.refusal: Exception | None = StoreUnavailable("the GPU history: database or disk is full")
        self.points: list = []

    async def add(self, points) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.points += points

    async def compact(self, **kwargs) -> Compacted:
        if self.refusal is not None:
            raise self.refusal
        return Compacted(merged=0, dropped=0)


async def test_the_gpu_history_writer_says_once_that_it_cannot_write_and_keeps_the_samples(caplog):
    caplog.set_level(logging.INFO, logger="gpuyard.services.monitor.history")
    history = FailingHistory()
    writer = HistoryWriter(history, MonitorSettings(node_name="n1"))
    ingest = SampleIngest()
    writer.attach(ingest)
    for n in range(TRIES):
        ingest.ingest(make_event(GpuSample(node="n1", gpus=[reading(0, float(n))]), source="/test"))
        await writer.write_once(compact=n % 5 == 0)
    lines = said(caplog, "gpuyard.services.monitor.history")
    assert lines == [
        "writing the GPU history: the GPU history: database or disk is full; tried again as before, and said "
        "again once it works (said once until then)"
    ]
    history.refusal = None
    await writer.write_once(compact=False)
    assert [p.utilization_pct for p in history.points] == [float(n) for n in range(TRIES)]  # none lost
    lines = said(caplog, "gpuyard.services.monitor.history")
    assert len(lines) == 2 and lines[1].startswith(f"writing the GPU history: resumed, after 0 s and {TRIES}")


@pytest.mark.parametrize("compact", [False, True])
async def test_a_history_beat_with_nothing_to_write_says_nothing(caplog, compact):
    caplog.set_level(logging.INFO, logger="gpuyard.services.monitor.history")
    history = FailingHistory()
    history.refusal = None
    writer = HistoryWriter(history, MonitorSettings(node_name="n1"))
    assert await writer.write_once(compact=compact) is compact
    assert said(caplog, "gpuyard.services.monitor.history") == [] and not writer.outage.failing
