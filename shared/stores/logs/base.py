"""The log store: every replica's output as chunks at byte offsets, so that logs can be read from any node.

The executor that runs a replica ships its output here as it comes (`LogShipper`); the API reads it back in
bounded pieces, from an offset or the last N lines, and follows it as it grows. Logs never travel on the bus,
and no service reads another's files: at scale the store is shared (MongoDB), on one machine it is a SQLite
file beside the event store (`logs.db`), so that log writes never wait on event writes.

A chunk is identified by its replica and its offset in the replica's output. Appending a chunk whose offset
is stored already changes nothing: a shipper that restarts and sends again does no harm. Chunks hold at most
`MAX_CHUNK` bytes, which bounds every read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

MAX_CHUNK = 64 * 1024
NOTE = "[gpuyard] "
"""How a line the platform writes into a job's output begins (an idle warning, the line that names an attempt
when the API sends every attempt's output)."""


@dataclass(frozen=True, slots=True, order=True)
class LogKey:
    """Whose output: one replica of one attempt of one job."""

    job_id: str
    attempt: int
    replica: int


@dataclass(frozen=True, slots=True)
class Chunk:
    key: LogKey
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True)
class Extent:
    """What is kept of a replica's output: bytes [start, end). `start` > 0 once older output was trimmed."""

    start: int
    end: int


def split(key: LogKey, offset: int, data: bytes) -> list[Chunk]:
    """`data` written at `offset`, as chunks of at most MAX_CHUNK bytes."""
    return [Chunk(key, offset + i, data[i : i + MAX_CHUNK]) for i in range(0, len(data), MAX_CHUNK)]


class LogStore(ABC):
    """What the executor and the API see of the log store, whatever the backend."""

    @abstractmethod
    async def append(self, chunks: list[Chunk]) -> None:
        """Store the chunks (each at most MAX_CHUNK bytes). A chunk at an offset already stored is ignored."""

    @abstractmethod
    async def extent(self, key: LogKey) -> Extent | None:
        """The kept bytes of one replica's output; None when it has written nothing yet."""

    @abstractmethod
    async def read(self, key: LogKey, start: int, end: int) -> list[Chunk]:
        """The stored chunks that overlap [start, end), oldest first, cut to that range."""

    @abstractmethod
    async def keys(self, job_id: str) -> list[LogKey]:
        """Every replica of every attempt of the job that has output, in order."""

    @abstractmethod
    async def trim(self, key: LogKey, before: int) -> None:
        """Forget the chunks that end at or before `before` (a size cap per replica)."""

    @abstractmethod
    async def delete_job(self, job_id: str) -> None:
        """Forget all of a job's output (retention)."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> LogStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def cut(chunks: list[Chunk], start: int, end: int) -> list[Chunk]:
    """The chunks' bytes inside [start, end), each cut to it; chunks outside are dropped."""
    out = []
    for c in chunks:
        if c.end <= start or c.offset >= end:
            continue
        lo, hi = max(start, c.offset), min(end, c.end)
        out.append(
            c if (lo, hi) == (c.offset, c.end) else Chunk(c.key, lo, c.data[lo - c.offset : hi - c.offset])
        )
    return out
