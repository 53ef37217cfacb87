"""The supervisor's status reporter never holds `gpuyard up`'s stop: a reporting task that loses its cancellation
(Python 3.11's asyncio.wait_for can swallow one when its own wait ends at the same moment) still ends, and
closing the reporter does not wait on a task that will not end."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from gpuyard.supervisor import statusreport
from gpuyard.supervisor.statusreport import StatusReporter

GENEROUS = 30.0
"""A bound on waits for what must come: a slow machine only takes longer to get there."""


class SlowBus:
    """A connected bus whose publish swallows a cancellation, as the wait_for race does, and takes its time."""

    def __init__(self) -> None:
        self.published = 0
        self.closed = False
        self.enough = asyncio.Event()

    async def publish(self, event) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the lost cancellation
            await asyncio.sleep(0.05)
        self.published += 1
        if self.published >= 3:
            self.enough.set()

    async def close(self) -> None:
        self.closed = True


class StuckBus(SlowBus):
    """A connected bus whose publish does not return, cancelled or not, until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    async def publish(self, event) -> None:
        self.entered.set()
        while not self.released.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # every cancellation lost
                await self.released.wait()


def reporting(monkeypatch, bus: SlowBus, publish_seconds: float = 0.5) -> tuple[StatusReporter, asyncio.Task]:
    """A reporter on `bus`, saying three processes' statuses again every 10 ms, and its running task."""
    monkeypatch.setattr(statusreport, "PUBLISH_SECONDS", publish_seconds)
    reporter = StatusReporter(["nats://127.0.0.1:1"], Path("/nonexistent"), interval=0.01)

    async def connected() -> SlowBus:
        return bus

    monkeypatch.setattr(reporter, "_connect", connected)
    reporter.latest = {f"p{i}": object() for i in range(3)}  # said again every interval
    monkeypatch.setattr(statusreport, "make_event", lambda status, source: status)
    return reporter, asyncio.create_task(reporter.run())


async def test_a_reporting_task_that_swallows_its_cancellation_still_ends(monkeypatch):
    bus = SlowBus()
    reporter, task = reporting(monkeypatch, bus)
    await bus.enough.wait()
    await asyncio.wait_for(reporter.close(task), GENEROUS)
    await asyncio.wait({task}, timeout=GENEROUS)
    assert task.done()  # it ended (cancelled, or by its own next turn)
    assert bus.closed


async def test_closing_does_not_wait_on_a_reporting_task_that_will_not_end(monkeypatch):
    bus = StuckBus()
    # its publish's own bound never runs out during the test: the task stays in it, whatever the machine's speed
    reporter, task = reporting(monkeypatch, bus, publish_seconds=3600)
    await bus.entered.wait()  # the task is in a publish that ignores its cancellation
    monkeypatch.setattr(statusreport, "PUBLISH_SECONDS", 0.5)  # the bounds of close's own steps
    try:
        closing = asyncio.create_task(reporter.close(task))
        done, _ = await asyncio.wait({closing}, timeout=GENEROUS)
        assert done, "closing the reporter hangs on a task that lost its cancellation"
        assert not task.done() and bus.closed  # closed while the task still ran: it did not wait for its end
    finally:
        bus.released.set()  # (else a close that hangs would hold the test's event loop too)
    await asyncio.wait({task}, timeout=GENEROUS)
    assert task.done()  # released, it ends: cancelled, or by `_closing` at its next turn
