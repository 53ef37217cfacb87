"""The embedded log store: a SQLite file of its own (`logs.db` beside the event store), WAL journal.

Writes go through one thread (SQLite takes one writer at a time; several processes queue up behind
`busy_timeout`), reads through another, so a long read never holds up the executor's shipping.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shared.logstore.base import MAX_CHUNK, Chunk, Extent, LogKey, LogStore, cut
from shared.paths import private_file
from shared.store.base import StoreUnavailable

SCHEMA = """
CREATE TABLE IF NOT EXISTS log_chunks (
    job_id  TEXT    NOT NULL,
    attempt INTEGER NOT NULL,
    replica INTEGER NOT NULL,
    offset  INTEGER NOT NULL,
    data    BLOB    NOT NULL,
    UNIQUE (job_id, attempt, replica, offset)
);
"""
BUSY_TIMEOUT_MS = 30_000
_KEY = "job_id = ? AND attempt = ? AND replica = ?"


class SqliteLogStore(LogStore):
    def __init__(self, path: Path):
        self.path = path
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logs-writer")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logs-reader")
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: str | Path) -> SqliteLogStore:
        store = cls(Path(path))
        store._write_conn = await store._on(store._writer, store._connect, True)
        store._read_conn = await store._on(store._reader, store._connect, False)
        return store

    def _connect(self, create: bool) -> sqlite3.Connection:
        try:
            if create:
                private_file(self.path, "-wal", "-shm")  # SQLite gives these two the file's own mode
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if create:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(SCHEMA)
            conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open the log store at {self.path}: {exc}") from exc
        return conn

    @staticmethod
    async def _on(pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def append(self, chunks: list[Chunk]) -> None:
        if not chunks:
            return
        if any(len(c.data) > MAX_CHUNK for c in chunks):
            raise ValueError(f"a log chunk holds at most {MAX_CHUNK} bytes")
        rows = [(c.key.job_id, c.key.attempt, c.key.replica, c.offset, c.data) for c in chunks]

        def write() -> None:
            with self._write_conn:  # one transaction
                self._write_conn.execute("BEGIN IMMEDIATE")
                self._write_conn.executemany(
                    "INSERT OR IGNORE INTO log_chunks (job_id, attempt, replica, offset, data) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )

        await self._on(self._writer, write)

    async def extent(self, key: LogKey) -> Extent | None:
        def query():
            return self._read_conn.execute(
                f"SELECT MIN(offset), (SELECT offset + length(data) FROM log_chunks WHERE {_KEY} "
                f"ORDER BY offset DESC LIMIT 1) FROM log_chunks WHERE {_KEY}",
                (*_args(key), *_args(key)),
            ).fetchone()

        start, end = await self._on(self._reader, query)
        return None if start is None else Extent(start, end)

    async def read(self, key: LogKey, start: int, end: int) -> list[Chunk]:
        def query():
            return self._read_conn.execute(
                f"SELECT offset, data FROM log_chunks WHERE {_KEY} AND offset > ? AND offset < ? ORDER BY offset",
                (*_args(key), start - MAX_CHUNK, end),
            ).fetchall()

        rows = await self._on(self._reader, query)
        return cut([Chunk(key, offset, bytes(data)) for offset, data in rows], start, end)

    async def keys(self, job_id: str) -> list[LogKey]:
        def query():
            return self._read_conn.execute(
                "SELECT DISTINCT attempt, replica FROM log_chunks WHERE job_id = ? ORDER BY attempt, replica",
                (job_id,),
            ).fetchall()

        return [LogKey(job_id, a, r) for a, r in await self._on(self._reader, query)]

    async def trim(self, key: LogKey, before: int) -> None:
        def write() -> None:
            self._write_conn.execute(
                f"DELETE FROM log_chunks WHERE {_KEY} AND offset + length(data) <= ?", (*_args(key), before)
            )

        await self._on(self._writer, write)

    async def delete_job(self, job_id: str) -> None:
        def write() -> None:
            self._write_conn.execute("DELETE FROM log_chunks WHERE job_id = ?", (job_id,))

        await self._on(self._writer, write)

    async def close(self) -> None:
        for conn, pool in ((self._write_conn, self._writer), (self._read_conn, self._reader)):
            if conn is not None:
                await self._on(pool, conn.close)
            pool.shutdown(wait=False)
        self._write_conn = self._read_conn = None


def _args(key: LogKey) -> tuple[str, int, int]:
    return key.job_id, key.attempt, key.replica
