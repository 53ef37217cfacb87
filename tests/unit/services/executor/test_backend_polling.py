"""The engines' backends read their engine in a loop (`poll_forever`): a read that fails is logged and tried
again, and the loop ends only when cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuyard.services.executor.backend import poll_forever

log = logging.getLogger("test-polling")


async def test_a_failed_read_is_logged_and_read_again(caplog: pytest.LogCaptureFixture) -> None:
    reads = 0
    read_again = asyncio.Event()

    async def poll() -> None:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise ConnectionError("the engine is away")
        read_again.set()

    caplog.set_level(logging.WARNING, logger="test-polling")
    loop = asyncio.create_task(poll_forever(poll, 0, "reading the engine failed", log))
    await asyncio.wait_for(read_again.wait(), 10)
    assert not loop.done()  # (the failure did not end it)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert [r.getMessage() for r in caplog.records] == ["reading the engine failed: the engine is away"]
