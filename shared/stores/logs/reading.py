"""Reading a replica's output from the log store in bounded pieces: a byte range, the last N lines, or
following it as it grows. Memory stays bounded by `PIECE` whatever the log's size."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from gpuyard.shared.stores.logs.base import Extent, LogKey, LogStore

PIECE = 1 << 20  # bytes read from the store at once
BACK_STEP = 64 * 1024  # bytes looked at per step when searching backwards for line starts


async def read_range(
    store: LogStore, key: LogKey, start: int = 0, end: int | None = None
) -> AsyncIterator[bytes]:
    """The kept bytes of [start, end) (to the end of what is kept by default), in pieces of at most PIECE
    bytes."""
    extent = await store.extent(key)
    if extent is None:
        return
    position = max(start, extent.start)
    end = extent.end if end is None else min(end, extent.end)
    while position < end:
        upto = min(end, position + PIECE)
        chunks = await store.read(key, position, upto)
        if chunks:
            yield b"".join(c.data for c in chunks)
        position = upto


async def tail_start(store: LogStore, key: LogKey, lines: int, extent: Extent) -> int:
    """The offset where the last `lines` lines of the kept output begin (a last line without its newline
    counts as a line)."""
    if lines <= 0:
        return extent.end
    wanted = lines  # newlines before the first line shown (the last line's own newline is set aside)
    position = extent.end
    first = True
    while position > extent.start:
        lo = max(extent.start, position - BACK_STEP)
        data = b"".join(c.data for c in await store.read(key, lo, position))
        if first and data.endswith(b"\n"):
            data, position = data[:-1], position - 1  # the last line's own newline
        first = False
        at = len(data)
        while wanted and (at := data.rfind(b"\n", 0, at)) >= 0:
            wanted -= 1
            if wanted == 0:
                return lo + at + 1
        position = lo
    return extent.start


async def follow(
    store: LogStore,
    key: LogKey,
    start: int,
    finished: Callable[[], Awaitable[bool]],
    poll: float = 0.25,
) -> AsyncIterator[bytes]:
    """The output from `start` on, as it is shipped, until `finished()` says no more will come and every
    byte shipped before that has been read."""
    position = start
    while True:
        done = await finished()  # asked before reading: output is shipped before the job ends
        extent = await store.extent(key)
        if extent is not None and extent.end > position:
            position = max(position, extent.start)
            async for piece in read_range(store, key, position, extent.end):
                yield piece
            position = extent.end
        if done:
            return
        await asyncio.sleep(poll)
