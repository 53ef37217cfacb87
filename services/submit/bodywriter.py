"""A request's body written as it comes, in writes of `batch` bytes made from a thread while the next bytes
arrive (one write in flight at a time, so at most two batches are held): what the model and volume uploads
stream through. Never a body whole in memory, and the event loop only hands chunks on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from gpuyard.shared.runtime.tarstream import CHUNK


async def write_body(
    chunks: AsyncIterator[bytes],
    write: Callable[[bytes], None],
    *,
    limit: int | None = None,
    over_limit: Callable[[], Exception] | None = None,
    batch: int = CHUNK,
) -> int:
    """Every chunk of `chunks` handed to `write` (blocking: run in a thread) in order, gathered into batches of
    at least `batch` bytes; the body's size. Past `limit` bytes, `over_limit()` is raised before the bytes
    beyond are written. A write's error is raised once the write in flight has ended."""
    pending: list[bytes] = []
    pending_size = size = 0
    in_flight: asyncio.Future[None] | None = None
    try:
        async for chunk in chunks:
            size += len(chunk)
            if limit is not None and size > limit:
                raise over_limit() if over_limit else ValueError(f"over {limit} bytes")
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= batch:
                if in_flight is not None:
                    await in_flight
                in_flight = asyncio.ensure_future(asyncio.to_thread(write, b"".join(pending)))
                pending, pending_size = [], 0
        if in_flight is not None:
            await in_flight
            in_flight = None
        if pending:
            await asyncio.to_thread(write, b"".join(pending))
    finally:
        if in_flight is not None:
            if not in_flight.done():
                await asyncio.wait([in_flight])  # (never a write after the caller's discard)
            if not in_flight.cancelled():
                in_flight.exception()  # (retrieved: the error raised is the one that ended the body)
    return size
