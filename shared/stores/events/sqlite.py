"""The embedded event store: one SQLite file in the data directory, safe for several processes on one host.

WAL journal and BEGIN IMMEDIATE transactions: writers of different processes queue up instead of failing.
Writes run at once when the lock is free, else on a dedicated thread that waits for it; reads run at once on
their own connection (a WAL reader sees the last commit without taking the lock, in a fraction of a
millisecond).
A writer that finds the lock taken retries within a millisecond or so: SQLite's own busy handler would sleep
in steps of up to 100 ms, which is most of a job's start latency when three services write at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.runtime.paths import private_file
from gpuyard.shared.stores.events.base import (
    Append,
    AppendResult,
    ConcurrencyError,
    EndedJob,
    Order,
    Page,
    Projection,
    StoredEvent,
    StoreUnavailable,
    StreamKind,
    StreamKindError,
    decode_cursor,
    encode_cursor,
    unavailable,
)
from gpuyard.shared.stores.events.sqliteschema import SCHEMA, migrate
from gpuyard.shared.stores.events.store import EventStore

VACUUM_PAGES = 2000
"""Free pages given back to the file system per `reclaim` (8 MiB of 4 KiB pages): a short hold of the lock."""
LOCK_TIMEOUT_SECONDS = 30.0
"""How long a write waits for a write lock another process holds, unless the store was opened with another
`lock_timeout` (a service that answers requests waits less than its clients do: `gpuyard.shared.runtime.service`)."""
STUCK_SECONDS = 2.0
"""After a write gave up on a lock held for the whole lock timeout, a write that finds it still held within this
long gives up at once (StoreBusy) instead of waiting the whole timeout again (a request answered by a retry of
the same write, writes queued behind the first)."""


JOB = StreamKind.JOB.value
"""(A query whose own index has no `kind` writes `+kind = ?`: a term checked on each row it finds, which no
index that begins with `kind` answers instead of its own.)"""
Outcome = AppendResult | ConcurrencyError | StreamKindError
"""What an append of a group commit comes to."""


def _filters(
    kind: StreamKind,
    states: list[str] | None,
    tenant: str | None,
    user: str | None,
    name: str | None,
    search: str | None,
) -> tuple[list[str], list[Any]]:
    """The WHERE terms (and their arguments) of a listing's filters (`Projections.list_projections`): on columns
    of `projections_state_listing`, none on the document."""
    where: list[str] = ["kind = ?"]
    args: list[Any] = [kind.value]
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args += states
    if tenant is not None:
        where.append("tenant = ?")
        args.append(tenant)
    if user is not None:
        where.append("user = ?")
        args.append(user)
    if name is not None:
        where.append("name = ?")
        args.append(name)
    if search:
        fields = ("stream_id", "name", "user", "tenant")
        where.append("(" + " OR ".join(f"{f} LIKE ? ESCAPE '\\'" for f in fields) + ")")
        args += [like_pattern(search)] * len(fields)
    return where, args


def like_pattern(text: str) -> str:
    """`%text%` for `LIKE ? ESCAPE '\\'`: `text` anywhere (LIKE folds the case of ASCII letters), its own
    `%`, `_` and `\\` taken literally."""
    return "%" + re.sub(r"([%_\\])", r"\\\1", text) + "%"


def _put_projection(conn: sqlite3.Connection, p: Projection, kind: StreamKind) -> None:
    user, name = (getattr(p.doc, field, None) for field in ("user", "name"))
    conn.execute(
        "INSERT INTO projections (stream_id, tenant, state, created_at, version, doc, ended_at, user, name, kind)"
        " VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (stream_id) DO UPDATE SET tenant=excluded.tenant,"
        " state=excluded.state, version=excluded.version, doc=excluded.doc, ended_at=excluded.ended_at",
        (
            p.stream_id,
            p.tenant,
            p.state,
            p.created_at,
            p.version,
            p.doc_json(),
            p.ended_at,
            user,
            name,
            kind.value,
        ),
    )


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class SqliteEventStore(EventStore):
    def __init__(self, path: str | Path, *, durable_commits: bool = True, lock_timeout: float | None = None):
        """`durable_commits`: each commit waits until the WAL is on disk (synchronous=FULL), so it survives a
        power loss; else (NORMAL) it survives a crash of the process but the last ones may not a power loss.
        `lock_timeout`: seconds a write waits for the lock another process holds before it gives up
        (StoreBusy); LOCK_TIMEOUT_SECONDS when None."""
        if lock_timeout is not None and not lock_timeout > 0:
            raise ValueError(f"a lock timeout must be more than 0 seconds, not {lock_timeout}")
        self.path = Path(path)
        self.durable_commits = durable_commits
        self._lock_timeout = lock_timeout
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._queued_writes = 0
        self._group: list[tuple[list, asyncio.Future]] = []
        self._committer: asyncio.Task | None = None
        self._stuck_until = 0.0

    @property
    def lock_timeout(self) -> float:
        """Seconds a write waits for the lock another process holds."""
        return LOCK_TIMEOUT_SECONDS if self._lock_timeout is None else self._lock_timeout

    @classmethod
    async def open(
        cls, path: str | Path, *, durable_commits: bool = True, lock_timeout: float | None = None
    ) -> SqliteEventStore:
        store = cls(path, durable_commits=durable_commits, lock_timeout=lock_timeout)
        store._conn = await store._run(store._connect, True)
        store._read_conn = await store._read(store._connect, False)
        return store

    def _connect(self, create: bool) -> sqlite3.Connection:
        try:
            if create:
                private_file(self.path, "-wal", "-shm")  # SQLite gives these two the file's own mode
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={0 if create else int(self.lock_timeout * 1000)}")
            if create:
                # a new file frees the pages of deleted rows on `reclaim` (an older one: after a VACUUM)
                self._with_lock(lambda: conn.execute("PRAGMA auto_vacuum=INCREMENTAL"))
                self._with_lock(lambda: conn.execute("PRAGMA journal_mode=WAL"))
                self._with_lock(lambda: conn.executescript(SCHEMA))
                self._with_lock(lambda: migrate(conn))
            conn.execute(f"PRAGMA synchronous={'FULL' if self.durable_commits else 'NORMAL'}")
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open the event store at {self.path}: {exc}") from exc
        return conn

    def _with_lock(self, fn: Callable[[], Any], wait: bool = True) -> Any:
        """Run `fn`, retrying while another process holds the write lock (short, growing sleeps) for up to the
        lock timeout; with `wait=False`, the lock error is raised at once."""
        if not wait:
            return fn()
        deadline = time.monotonic() + self.lock_timeout
        pause = 0.0002
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.004)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    async def _write(self, fn, *args):
        """A write runs at once on the caller's thread when the lock is free and no earlier write waits on
        the writer thread (a commit without fsync takes a fraction of a millisecond, less than handing it to a
        thread and back); when another process holds the lock, it waits on the writer thread."""
        try:
            if not self._queued_writes:
                try:
                    return fn(*args, wait=False)
                except sqlite3.OperationalError as exc:
                    if not _locked(exc):
                        raise
                    if time.monotonic() < self._stuck_until:  # still held: not waited for again so soon
                        self._stuck_until = time.monotonic() + STUCK_SECONDS
                        raise
            self._queued_writes += 1
            try:
                return await self._run(self._queued, fn, *args)
            finally:
                self._queued_writes -= 1
        except (sqlite3.Error, OSError) as exc:
            if (found := self._unavailable(exc)) is None:
                raise
            raise found from exc

    def _queued(self, fn, *args):
        """On the writer thread: `fn` waits for the lock, unless another write just gave up on it (then it is
        tried once); a wait that outlasts the lock timeout marks the lock stuck for STUCK_SECONDS."""
        try:
            return fn(*args, wait=time.monotonic() >= self._stuck_until)
        except sqlite3.OperationalError as exc:
            if _locked(exc):
                self._stuck_until = time.monotonic() + STUCK_SECONDS
            raise

    async def _read(self, fn, *args):
        """Reads run on the caller's thread: a WAL read never waits for a writer and takes a fraction of a
        millisecond, less than handing it to a thread and back."""
        try:
            return fn(*args)
        except (sqlite3.Error, OSError) as exc:
            if (found := self._unavailable(exc)) is None:
                raise
            raise found from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable | None:
        """What a caller sees of SQLite's error: StoreFull (SQLITE_FULL, ENOSPC), StoreBusy (the lock held by
        another process for the lock timeout), StoreUnavailable (another I/O failure); None for a bug, which
        goes on as it is (`gpuyard.shared.stores.events.base.unavailable`). The API answers the first three with 503 and
        Retry-After."""
        return unavailable("the event store", exc, lock_timeout=self.lock_timeout)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("the event store is closed")
        return self._conn

    @property
    def read_conn(self) -> sqlite3.Connection:
        if self._read_conn is None:
            raise StoreUnavailable("the event store is closed")
        return self._read_conn

    # ------------------------------------------------------------------ writes

    async def append(
        self,
        stream_id: str,
        expected_version: int,
        events: list[CloudEvent],
        projection: Projection | None = None,
        *,
        kind: StreamKind = StreamKind.JOB,
    ) -> AppendResult:
        [result] = await self.append_many([Append(stream_id, expected_version, events, projection, kind)])
        if isinstance(result, ConcurrencyError):
            raise result
        return result

    async def append_many(self, appends: list[Append]) -> list[AppendResult | ConcurrencyError]:
        """One transaction for all of them: what a scheduling cycle decides costs one commit.

        Group commit: appends asked for by other tasks in the same turn of the event loop (several requests
        or events handled at once) share that transaction. A commit is most of an append's cost (each page it
        changes is written to the WAL); the appends of one commit are applied in the order they were asked."""
        rows = [
            (a, [(e.id, e.type, e.model_dump_json(serialize_as_any=True)) for e in a.events]) for a in appends
        ]
        done: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self._group.append((rows, done))
        if len(self._group) == 1:
            self._committer = asyncio.create_task(self._commit_group())
        results = await done
        for result in results:
            if isinstance(result, StreamKindError):
                raise result  # (a bug of the writer: the appends of other streams went in)
        return [result for result in results if not isinstance(result, StreamKindError)]

    async def _commit_group(self) -> None:
        await asyncio.sleep(0)  # the other appends of this turn of the loop join the group
        group, self._group = self._group, []
        try:
            results = await self._write(self._append_many, [row for rows, _ in group for row in rows])
        except BaseException as exc:
            for _, done in group:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for rows, done in group:
            mine, results = results[: len(rows)], results[len(rows) :]
            if not done.done():
                done.set_result(mine)

    def _append_many(self, rows, wait: bool = True) -> list[Outcome]:
        """(A StreamKindError is returned in its append's place, as a conflict is: the group's others go in.)"""
        conn = self.conn
        self._with_lock(lambda: conn.execute("BEGIN IMMEDIATE"), wait)
        try:
            results = [self._append_one(conn, a, events) for a, events in rows]
            conn.execute("COMMIT")
            return results
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _append_one(conn, a: Append, rows) -> Outcome:
        ids = [r[0] for r in rows]
        marks = ",".join("?" * len(ids))
        known = conn.execute(f"SELECT COUNT(*) FROM events WHERE event_id IN ({marks})", ids).fetchone()[0]
        current, held = conn.execute(
            "SELECT version, kind FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1",
            (a.stream_id,),
        ).fetchone() or (0, a.kind.value)
        if known == len(ids):
            return AppendResult(version=current, duplicate=True)
        if held != a.kind:
            return StreamKindError(a.stream_id, a.kind, held)
        if current != a.expected_version or known:
            return ConcurrencyError(a.stream_id, a.expected_version, current)
        now = time.time()
        conn.executemany(
            "INSERT INTO events (stream_id, version, event_id, type, data, recorded_at, kind)"
            " VALUES (?,?,?,?,?,?,?)",
            [
                (a.stream_id, a.expected_version + i, eid, typ, data, now, a.kind.value)
                for i, (eid, typ, data) in enumerate(rows, 1)
            ],
        )
        if a.projection is not None:
            _put_projection(conn, a.projection, a.kind)
        return AppendResult(version=a.expected_version + len(rows))

    async def mark_published(self, event_ids: list[str]) -> None:
        if event_ids:
            await self._write(self._mark_published, event_ids)

    def _mark_published(self, event_ids: list[str], wait: bool = True) -> None:
        marks = ",".join("?" * len(event_ids))
        sql = f"UPDATE events SET published = 1 WHERE event_id IN ({marks})"
        self._with_lock(lambda: self.conn.execute(sql, event_ids), wait)

    # ------------------------------------------------------------------ reads

    async def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        rows = await self._read(
            lambda: self.read_conn.execute(
                "SELECT version, data FROM events WHERE stream_id = ? AND version > ? ORDER BY version",
                (stream_id, after_version),
            ).fetchall()
        )
        return [StoredEvent(stream_id, v, CloudEvent.from_json(d)) for v, d in rows]

    async def get_projection(
        self, stream_id: str, *, kind: StreamKind = StreamKind.JOB
    ) -> dict[str, Any] | None:
        row = await self._read(
            lambda: self.read_conn.execute(
                "SELECT doc FROM projections WHERE stream_id = ? AND kind = ?", (stream_id, kind.value)
            ).fetchone()
        )
        return json.loads(row[0]) if row else None

    async def list_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        order: Order = "newest",
        limit: int = 50,
        cursor: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> Page:
        where, args = _filters(kind, states, tenant, user, name, search)
        if cursor:
            created_at, stream_id = decode_cursor(cursor, order)
            where.append(f"(created_at, stream_id) {'<' if order == 'newest' else '>'} (?, ?)")
            args += [created_at, stream_id]
        direction = "DESC" if order == "newest" else "ASC"
        by = f"ORDER BY created_at {direction}, stream_id {direction}"
        page_rows = (  # the page's rows from the index, then their documents (`projections_state_listing`)
            f"SELECT rowid FROM projections WHERE {' AND '.join(where)} {by} LIMIT ?"
        )
        sql = f"SELECT created_at, stream_id, doc FROM projections WHERE rowid IN ({page_rows}) {by}"
        rows = await self._read(lambda: self.read_conn.execute(sql, [*args, limit + 1]).fetchall())
        page = Page(items=[json.loads(doc) for _, _, doc in rows[:limit]])
        if len(rows) > limit:
            created_at, stream_id, _ = rows[limit - 1]
            page.next_cursor = encode_cursor(created_at, stream_id, order)
        return page

    async def count_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> int:
        where, args = _filters(kind, states, tenant, user, name, search)
        sql = "SELECT count(*) FROM projections WHERE " + " AND ".join(where)
        return (await self._read(lambda: self.read_conn.execute(sql, args).fetchone()))[0]

    async def versions(self, *, states: list[str], created_before: str | None = None) -> dict[str, int]:
        sql = (
            "SELECT stream_id, version FROM projections"
            f" WHERE kind = ? AND state IN ({','.join('?' * len(states))})"
        )
        args: list = [JOB, *states]
        if created_before is not None:  # (a range of `projections_state_listing` per state)
            sql += " AND created_at < ?"
            args.append(created_before)
        return dict(await self._read(lambda: self.read_conn.execute(sql, args).fetchall()))

    async def put_document(self, key: str, doc: dict[str, Any]) -> None:
        text = json.dumps(doc, separators=(",", ":"))
        sql = "INSERT INTO documents (key, doc) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET doc = excluded.doc"
        await self._write(
            lambda wait=True: self._with_lock(lambda: self.conn.execute(sql, (key, text)), wait)
        )

    async def get_document(self, key: str) -> dict[str, Any] | None:
        sql = "SELECT doc FROM documents WHERE key = ?"
        row = await self._read(lambda: self.read_conn.execute(sql, (key,)).fetchone())
        return json.loads(row[0]) if row else None

    async def ended_since(self, after: str, *, limit: int = 1000) -> list[EndedJob]:
        sql = (  # (on `projections_expiring`, whose condition the first two terms repeat)
            "SELECT stream_id, tenant, state, ended_at,"
            " coalesce(json_extract(doc, '$.attempts[0].queued_at'), created_at),"
            " json_extract(doc, '$.attempts[0].started_at')"
            " FROM projections WHERE compacted = 0 AND ended_at IS NOT NULL AND ended_at >= ? AND +kind = ?"
            " ORDER BY ended_at, stream_id LIMIT ?"
        )
        rows = await self._read(lambda: self.read_conn.execute(sql, (after, JOB, limit)).fetchall())
        return [EndedJob(*row) for row in rows]

    async def count_by_tenant(self, *, states: list[str]) -> dict[str, int]:
        sql = (
            "SELECT tenant, count(*) FROM projections"
            f" WHERE kind = ? AND state IN ({','.join('?' * len(states))}) GROUP BY tenant"
        )
        return dict(await self._read(lambda: self.read_conn.execute(sql, [JOB, *states]).fetchall()))

    async def oldest_by_tenant(self, *, states: list[str]) -> dict[str, str]:
        sql = (
            "SELECT tenant, min(created_at) FROM projections"
            f" WHERE kind = ? AND state IN ({','.join('?' * len(states))}) GROUP BY tenant"
        )
        return dict(await self._read(lambda: self.read_conn.execute(sql, [JOB, *states]).fetchall()))

    async def ids_starting(self, prefix: str, *, tenant: str | None = None, limit: int = 10) -> list[str]:
        sql = "SELECT stream_id FROM projections WHERE stream_id >= ? AND stream_id < ? AND +kind = ?"
        args: list = [
            prefix,
            prefix + "\U0010ffff",
            JOB,
        ]  # (the range is what the primary key's index answers)
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        sql += " ORDER BY stream_id LIMIT ?"
        rows = await self._read(lambda: self.read_conn.execute(sql, [*args, limit]).fetchall())
        return [stream_id for (stream_id,) in rows]

    async def unpublished(self, *, older_than: float, limit: int = 500) -> list[CloudEvent]:
        cutoff = time.time() - older_than
        rows = await self._read(
            lambda: self.read_conn.execute(
                "SELECT data FROM events WHERE published = 0 AND recorded_at <= ? ORDER BY position LIMIT ?",
                (cutoff, limit),
            ).fetchall()
        )
        return [CloudEvent.from_json(d) for (d,) in rows]

    # ------------------------------------------------------------------ retention

    async def expired(self, *, ended_before: str, limit: int = 500) -> list[str]:
        rows = await self._read(
            lambda: self.read_conn.execute(
                "SELECT stream_id FROM projections WHERE compacted = 0 AND ended_at IS NOT NULL"
                " AND ended_at < ? AND +kind = ? ORDER BY ended_at LIMIT ?",
                (ended_before, JOB, limit),
            ).fetchall()
        )
        return [stream_id for (stream_id,) in rows]

    async def compact(self, stream_id: str) -> int:
        return await self._write(self._compact, stream_id)

    def _compact(self, stream_id: str, wait: bool = True) -> int:
        conn = self.conn
        self._with_lock(lambda: conn.execute("BEGIN IMMEDIATE"), wait)
        try:
            row = conn.execute(
                "SELECT ended_at IS NOT NULL AND compacted = 0, version FROM projections"
                " WHERE stream_id = ? AND kind = ?",
                (stream_id, JOB),
            ).fetchone()
            unpublished = conn.execute(
                "SELECT COUNT(*) FROM events WHERE stream_id = ? AND published = 0", (stream_id,)
            ).fetchone()[0]
            deleted = 0
            if row is not None and row[0] and not unpublished:
                deleted = conn.execute(
                    "DELETE FROM events WHERE stream_id = ? AND version > 1 AND version < ?",
                    (stream_id, row[1]),
                ).rowcount
                conn.execute("UPDATE projections SET compacted = 1 WHERE stream_id = ?", (stream_id,))
            conn.execute("COMMIT")
            return deleted
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def reclaim(self) -> None:
        await self._write(self._reclaim)

    def _reclaim(self, wait: bool = True) -> None:
        """Free pages back to the file system, a bounded number per call (the file must have been created
        with auto_vacuum=INCREMENTAL; otherwise SQLite reuses them for new rows and the file stops growing)."""
        self._with_lock(
            lambda: self.conn.execute(f"PRAGMA incremental_vacuum({VACUUM_PAGES})").fetchall(), wait
        )

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        if self._read_conn is not None:
            reader, self._read_conn = self._read_conn, None
            reader.close()
        if self._conn is not None:
            writer, self._conn = self._conn, None
            await loop.run_in_executor(self._writer, writer.close)
        self._writer.shutdown(wait=False)
