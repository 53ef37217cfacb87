"""The supervisor's status reporter never holds `gpuyard up`'s stop: even a reporting task that loses its
cancellation (Python 3.11's asyncio.wait_for can swallow one when its own wait ends at the same moment) ends, and
closing it is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from gpuyard import statusreport
from gpuyard.statusreport import StatusReporter


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


async def test_a_reporting_task_that_swallows_its_cancellation_still_ends_and_close_is_bounded(monkeypatch):
    monkeypatch.setattr(statusreport, "PUBLISH_SECONDS", 0.5)
    reporter = StatusReporter(["nats://127.0.0.1:1"], Path("/nonexistent"), interval=0.01)
    bus = SlowBus()

    async def connected() -> SlowBus:
        return bus

    monkeypatch.setattr(reporter, "_connect", connected)
    reporter.latest = {f"p{i}": object() for i in range(3)}  # said again every interval
    monkeypatch.setattr(statusreport, "make_event", lambda status, source: status)
    task = asyncio.create_task(reporter.run())
    await bus.enough.wait()
    started = time.monotonic()
    closing = asyncio.create_task(reporter.close(task))
    done, _ = await asyncio.wait({closing}, timeout=5)
    assert done, "closing the reporter hangs on a task that lost its cancellation"
    assert time.monotonic() - started < 2.5  # bounded, however the task took its cancellation
    await asyncio.wait({task}, timeout=1)
    assert task.done()  # it ended (cancelled, or by its own next turn)
    assert bus.closed
