"""A command run in a replica, as the exec session (`session.py`) drives it, whatever the backend: its output
pumped out, its input written, its terminal resized, its end awaited, and the whole of it killed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

Send = Callable[[int, bytes], Awaitable[None]]
"""Where its output goes: (stream: STDOUT or STDERR, data)."""


class ExecProcess(ABC):
    @abstractmethod
    async def pump_output(self, send: Send) -> None:
        """Send its output as it comes, until there is no more."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Its input (ignored once it no longer reads it)."""

    @abstractmethod
    async def close_stdin(self) -> None: ...

    @abstractmethod
    def resize(self, cols: int, rows: int) -> None:
        """Its terminal's new size (nothing without a terminal)."""

    @abstractmethod
    async def wait(self) -> int:
        """Its exit code, as a shell says it (128 + N: ended by signal N)."""

    @abstractmethod
    async def kill(self) -> None:
        """End it and what it started (the caller left, or the replica ended)."""

    @abstractmethod
    def replica_alive(self) -> bool:
        """Whether the replica it runs in still runs (an exec never outlives its job)."""
