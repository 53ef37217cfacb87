"""A SQLite file of the platform's own beside the event store (the log store's `logs.db`, the GPU history's
`gpu_history.db`): private to the platform (0600, and so are its `-wal` and `-shm`), WAL journal, one thread for
writes (SQLite takes one writer at a time; several processes queue up behind `busy_timeout`) and another for
reads, so that a long read never holds up a write and the event loop never waits on SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Self

from gpuyard.shared.runtime.paths import private_file
from gpuyard.shared.stores.events.base import StoreUnavailable

BUSY_TIMEOUT_MS = 30_000


class SqliteFile:
    """Subclasses name what they are (`WHAT`, for errors) and their `SCHEMA`; `open` makes the file."""

    WHAT: ClassVar[str]
    SCHEMA: ClassVar[str]
    THREAD: ClassVar[str]  # the prefix of its two threads' names

    def __init__(self, path: Path):
        self.path = path
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.THREAD}-writer")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.THREAD}-reader")
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: str | Path) -> Self:
        opened = cls(Path(path))
        opened._write_conn = await opened._on(opened._writer, opened._connect, True)
        opened._read_conn = await opened._on(opened._reader, opened._connect, False)
        return opened

    @property
    def write_conn(self) -> sqlite3.Connection:
        """The connection of the writer thread (use it there only); StoreUnavailable before `open` or once
        closed."""
        if self._write_conn is None:
            raise StoreUnavailable(f"{self.WHAT} at {self.path} is not open")
        return self._write_conn

    @property
    def read_conn(self) -> sqlite3.Connection:
        """The connection of the reader thread (use it there only); StoreUnavailable before `open` or once
        closed."""
        if self._read_conn is None:
            raise StoreUnavailable(f"{self.WHAT} at {self.path} is not open")
        return self._read_conn

    def _connect(self, create: bool) -> sqlite3.Connection:
        try:
            if create:
                private_file(self.path, "-wal", "-shm")  # SQLite gives these two the file's own mode
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if create:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(self.SCHEMA)
            conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open {self.WHAT} at {self.path}: {exc}") from exc
        return conn

    async def _on(self, pool: ThreadPoolExecutor, fn, *args):
        """`fn(*args)` on `pool`'s thread; a SQLite error is StoreUnavailable, saying which file."""
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.WHAT}: {exc}") from exc

    async def close(self) -> None:
        for conn, pool in ((self._write_conn, self._writer), (self._read_conn, self._reader)):
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(pool, conn.close)
            pool.shutdown(wait=False)
        self._write_conn = self._read_conn = None
