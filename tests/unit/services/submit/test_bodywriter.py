"""`write_body`: a body's chunks written in order, in batches, one write in flight while the next bytes come."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuyard.services.submit.bodywriter import write_body


async def _chunks(parts, gate: asyncio.Event | None = None, after: int = 0):
    for i, part in enumerate(parts):
        if gate is not None and i == after:
            await gate.wait()
        yield part


async def test_every_byte_is_written_in_order_in_batches_of_at_least_the_batch():
    parts = [bytes([i]) * 3 for i in range(10)]
    writes: list[bytes] = []
    size = await write_body(_chunks(parts), writes.append, batch=7)
    assert b"".join(writes) == b"".join(parts)
    assert size == 30
    assert all(len(w) >= 7 for w in writes[:-1])


async def test_the_next_chunks_are_read_while_a_batch_is_being_written():
    next_asked = threading.Event()

    def write(data: bytes) -> None:
        if data.startswith(b"a"):
            assert next_asked.wait(10), "the next chunk was not read while the first batch was written"

    async def chunks():
        yield b"a" * 4
        next_asked.set()  # (reached when the next chunk is asked for)
        yield b"b" * 4

    assert await write_body(chunks(), write, batch=4) == 8


async def test_past_the_limit_the_callers_error_is_raised_before_the_bytes_beyond_are_written():
    writes: list[bytes] = []

    class TooLarge(Exception):
        pass

    with pytest.raises(TooLarge):
        await write_body(_chunks([b"x" * 5, b"y" * 5]), writes.append, limit=8, over_limit=TooLarge, batch=5)
    assert b"y" not in b"".join(writes)


async def test_a_failed_write_is_raised_and_no_write_runs_after_the_call_returns():
    calls: list[int] = []

    def write(data: bytes) -> None:
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        await write_body(_chunks([b"x" * 4] * 6), write, batch=4)
    count = len(calls)
    await asyncio.sleep(0)
    assert len(calls) == count <= 3


async def test_an_error_of_the_body_returns_only_once_the_write_in_flight_has_ended():
    gate = threading.Event()
    order: list[str] = []

    def write(data: bytes) -> None:
        gate.wait(10)
        order.append("write ended")

    async def chunks():
        yield b"x" * 4
        asyncio.get_running_loop().call_later(0.05, gate.set)
        raise ConnectionError("the client went away")

    with pytest.raises(ConnectionError):
        await write_body(chunks(), write, batch=4)
    order.append("returned")
    assert order == ["write ended", "returned"]
