"""A service run by the real `run_service` that goes wrong when told to (the file GPUYARD_TEST_CRASH appears):
its main task raises, or with GPUYARD_TEST_BLOCK set, it blocks the event loop (a call that never returns). A
background task ignores cancellation, as a task stuck in a call that swallows it would.
`python -m tests.integration.crashing_service --nats-url ... --data-dir ... --health-port ...`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from gpuyard.shared.runtime.service import Service, run_service
from gpuyard.shared.settings.common import CommonSettings


async def stubborn() -> None:
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # as a call that swallows it would
            await asyncio.sleep(3600)


async def main(service: Service, settings: CommonSettings) -> None:
    service.spawn(stubborn(), "stubborn")
    trigger = Path(os.environ["GPUYARD_TEST_CRASH"])
    while not trigger.exists():  # noqa: ASYNC110 (a file another process makes)
        await asyncio.sleep(0.05)
    if os.environ.get("GPUYARD_TEST_BLOCK"):
        time.sleep(3600)  # noqa: ASYNC251 (on purpose: the loop stuck)
    raise RuntimeError("main crashed on purpose")


if __name__ == "__main__":
    run_service("crashing", CommonSettings, main)
