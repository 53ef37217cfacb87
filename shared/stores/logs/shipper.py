"""Shipping replicas' output to the log store: buffered per replica, sent in batches.

`write` is called with every piece of output a replica prints; it only appends to a buffer, so a chatty job
costs the executor no store round trip per line. A flusher sends everything buffered at most every
`interval` seconds (or at once when a buffer fills a chunk), in one append. A replica's log is capped at
`max_bytes`: older output is trimmed from the store as the newest comes. When the store cannot be reached, the
buffers keep up to `max_buffer` bytes per replica (the oldest unsent output beyond that is dropped: the node's
own log file still has it) and are sent once it is back; the shipper says once that it cannot ship, and once
that it ships again.
"""

from __future__ import annotations

import asyncio
import logging

from gpuyard.shared.stores.logs.base import MAX_CHUNK, Chunk, LogKey, LogStore, split

log = logging.getLogger(__name__)


class _Buffer:
    __slots__ = ("offset", "parts", "size", "closed")

    def __init__(self, offset: int) -> None:
        self.offset = offset  # where the buffered bytes begin in the replica's output
        self.parts: list[bytes] = []
        self.size = 0
        self.closed = False


class LogShipper:
    def __init__(
        self,
        store: LogStore,
        *,
        interval: float = 0.5,
        max_bytes: int = 0,
        max_buffer: int = 8 << 20,
    ) -> None:
        self.store = store
        self.interval = interval
        self.max_bytes = max_bytes
        self.max_buffer = max_buffer
        self._buffers: dict[LogKey, _Buffer] = {}
        self._wake = asyncio.Event()
        # One flush at a time: the flusher and the executor (which flushes when a replica exits) may call at
        # once, and a second flush running while the first awaits the store would see a closed buffer already
        # emptied and forget it, then the first would forget it again (KeyError) or put a failed append's bytes
        # back into a buffer no longer shipped.
        self._flushing = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._failing = False

    def open(self, key: LogKey, offset: int = 0) -> None:
        """Start shipping a replica's output, which goes on from `offset` (0 for a new replica)."""
        self._buffers.setdefault(key, _Buffer(offset))

    def write(self, key: LogKey, data: bytes) -> None:
        buffer = self._buffers.get(key)
        if buffer is None or not data:
            return
        buffer.parts.append(data)
        buffer.size += len(data)
        if buffer.size > self.max_buffer:
            self._drop_oldest(buffer)
        if buffer.size >= MAX_CHUNK:
            self._wake.set()

    def close(self, key: LogKey) -> None:
        """No more output will come: what is buffered is sent with the next flush, then the replica is
        forgotten."""
        buffer = self._buffers.get(key)
        if buffer is not None:
            buffer.closed = True
            self._wake.set()

    @property
    def replicas(self) -> int:
        """Replicas shipped now (closed ones not yet flushed included)."""
        return len(self._buffers)

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="log-shipper")

    async def stop(self) -> None:
        """Send what is left (one last try), then stop."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        await self._task
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the store is down or full: keep the buffers, try again later
                if not self._failing:  # (said once until a flush succeeds: a full disk fails every one)
                    log.warning("cannot ship logs to the log store (tried again until it can): %s", exc)
                self._failing = True
                if not self._stopping:
                    await asyncio.sleep(self.interval)
            else:
                if self._failing:
                    log.warning("logs are shipped to the log store again")
                self._failing = False
            if self._stopping:
                return

    async def flush(self) -> None:
        """Send every buffered byte in one append; forget closed replicas once sent. Output written while
        the append is under way stays for the next flush; an append that fails puts its bytes back. A flush
        called while another runs waits for it, then sends what is left."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        chunks: list[Chunk] = []
        taken: list[tuple[LogKey, _Buffer, bytes]] = []
        for key, buffer in list(self._buffers.items()):
            if buffer.size:
                data = b"".join(buffer.parts)
                chunks += split(key, buffer.offset, data)
                taken.append((key, buffer, data))
                buffer.parts, buffer.size = [], 0
                buffer.offset += len(data)
            elif buffer.closed:
                del self._buffers[key]
        if not chunks:
            return
        try:
            await self.store.append(chunks)
        except BaseException:
            for _, buffer, data in taken:
                buffer.parts.insert(0, data)
                buffer.size += len(data)
                buffer.offset -= len(data)
            raise
        for key, buffer, _ in taken:
            if self.max_bytes and buffer.offset > self.max_bytes:
                await self.store.trim(key, buffer.offset - self.max_bytes)
            if buffer.closed and not buffer.size and self._buffers.get(key) is buffer:
                del self._buffers[key]

    @staticmethod
    def _drop_oldest(buffer: _Buffer) -> None:
        while buffer.size > 0 and len(buffer.parts) > 1 and buffer.size - len(buffer.parts[0]) >= MAX_CHUNK:
            dropped = buffer.parts.pop(0)
            buffer.size -= len(dropped)
            buffer.offset += len(dropped)
