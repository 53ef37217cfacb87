"""The embedded log store: a SQLite file of its own (`logs.db` beside the event store), WAL journal.

Writes go through one thread, reads through another (`gpuyard.shared.stores.sqlitefile`), so a long read never holds up the
executor's shipping.
"""

from __future__ import annotations

from gpuyard.shared.stores.logs.base import MAX_CHUNK, Chunk, Extent, LogKey, LogStore, cut
from gpuyard.shared.stores.sqlitefile import SqliteFile

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
_KEY = "job_id = ? AND attempt = ? AND replica = ?"


class SqliteLogStore(SqliteFile, LogStore):
    WHAT = "the log store"
    SCHEMA = SCHEMA
    THREAD = "logs"

    async def append(self, chunks: list[Chunk]) -> None:
        if not chunks:
            return
        if any(len(c.data) > MAX_CHUNK for c in chunks):
            raise ValueError(f"a log chunk holds at most {MAX_CHUNK} bytes")
        rows = [(c.key.job_id, c.key.attempt, c.key.replica, c.offset, c.data) for c in chunks]

        def write() -> None:
            with self.write_conn:  # one transaction
                self.write_conn.execute("BEGIN IMMEDIATE")
                self.write_conn.executemany(
                    "INSERT OR IGNORE INTO log_chunks (job_id, attempt, replica, offset, data) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )

        await self._on(self._writer, write)

    async def extent(self, key: LogKey) -> Extent | None:
        def query():
            return self.read_conn.execute(
                f"SELECT MIN(offset), (SELECT offset + length(data) FROM log_chunks WHERE {_KEY} "
                f"ORDER BY offset DESC LIMIT 1) FROM log_chunks WHERE {_KEY}",
                (*_args(key), *_args(key)),
            ).fetchone()

        start, end = await self._on(self._reader, query)
        return None if start is None else Extent(start, end)

    async def read(self, key: LogKey, start: int, end: int) -> list[Chunk]:
        def query():
            return self.read_conn.execute(
                f"SELECT offset, data FROM log_chunks WHERE {_KEY} AND offset > ? AND offset < ? ORDER BY offset",
                (*_args(key), start - MAX_CHUNK, end),
            ).fetchall()

        rows = await self._on(self._reader, query)
        return cut([Chunk(key, offset, bytes(data)) for offset, data in rows], start, end)

    async def keys(self, job_id: str) -> list[LogKey]:
        def query():
            return self.read_conn.execute(
                "SELECT DISTINCT attempt, replica FROM log_chunks WHERE job_id = ? ORDER BY attempt, replica",
                (job_id,),
            ).fetchall()

        return [LogKey(job_id, a, r) for a, r in await self._on(self._reader, query)]

    async def trim(self, key: LogKey, before: int) -> None:
        def write() -> None:
            self.write_conn.execute(
                f"DELETE FROM log_chunks WHERE {_KEY} AND offset + length(data) <= ?", (*_args(key), before)
            )

        await self._on(self._writer, write)

    async def delete_job(self, job_id: str) -> None:
        def write() -> None:
            self.write_conn.execute("DELETE FROM log_chunks WHERE job_id = ?", (job_id,))

        await self._on(self._writer, write)


def _args(key: LogKey) -> tuple[str, int, int]:
    return key.job_id, key.attempt, key.replica
