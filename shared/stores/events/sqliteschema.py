"""The embedded event store's tables and indexes, and the migrations that bring a file made by an older release
up to them: each runs once, when a store first opens the file, in a transaction of its own."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from gpuyard.shared.stores.events.base import StreamKind
from gpuyard.shared.stores.events.kindbackfill import (
    ID_PREFIXES,
    NODE_CONTROL,
    NODE_FLAGS,
    NODE_READY,
    RENAMED_STATES,
    id_range,
)

JOB = StreamKind.JOB.value
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events (
    position    INTEGER PRIMARY KEY,  -- rowid: one more than the largest (compaction keeps each stream's last)
    stream_id   TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    event_id    TEXT    NOT NULL UNIQUE,
    type        TEXT    NOT NULL,
    data        TEXT    NOT NULL,
    recorded_at REAL    NOT NULL,
    published   INTEGER NOT NULL DEFAULT 0,
    kind        TEXT    NOT NULL DEFAULT '{JOB}',  -- its stream's (`StreamKind`)
    UNIQUE (stream_id, version)
);
DROP INDEX IF EXISTS events_outbox;  -- (recorded_at): the outbox query, ordered by position, scanned the table
CREATE INDEX IF NOT EXISTS events_unpublished ON events (position) WHERE published = 0;
CREATE TABLE IF NOT EXISTS projections (
    stream_id  TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    state      TEXT NOT NULL,
    created_at TEXT NOT NULL,
    version    INTEGER NOT NULL,
    doc        TEXT NOT NULL,
    ended_at   TEXT,                       -- when it reached a final state (retention counts from it)
    compacted  INTEGER NOT NULL DEFAULT 0, -- its events were collapsed to the first and the last
    user       TEXT,                       -- the doc's `user` and `name` as first written (a job's never change)
    name       TEXT,
    kind       TEXT NOT NULL DEFAULT '{JOB}'  -- its stream's (`StreamKind`): every query filters on it
);
DROP INDEX IF EXISTS projections_state_tenant;  -- (state, tenant): `projections_state_tenant_created` answers it
CREATE TABLE IF NOT EXISTS documents (  -- `put_document`: one writer's state, replaced whole
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
"""
"""The tables (with every column of this release, for a new file) and what holds on the first columns only."""
MIGRATIONS = {  # columns added since the first release: added to an older file when it is opened
    "ended_at": "ALTER TABLE projections ADD COLUMN ended_at TEXT;"
    " UPDATE projections SET ended_at = json_extract(doc, '$.finished_at')"
    " WHERE state IN ('succeeded', 'failed', 'cancelled');",
    "compacted": "ALTER TABLE projections ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0;",
    "user": "ALTER TABLE projections ADD COLUMN user TEXT; ALTER TABLE projections ADD COLUMN name TEXT;"
    " UPDATE projections SET user = json_extract(doc, '$.user'), name = json_extract(doc, '$.name');",
}
INDEXES = [
    "CREATE INDEX IF NOT EXISTS projections_tenant ON projections (tenant, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS projections_created ON projections (created_at DESC, stream_id DESC)",
    # (count_by_tenant, oldest_by_tenant: from the index alone)
    "CREATE INDEX IF NOT EXISTS projections_state_tenant_created ON projections (kind, state, tenant, created_at)",
    "CREATE INDEX IF NOT EXISTS projections_expiring ON projections (ended_at)"
    " WHERE compacted = 0 AND ended_at IS NOT NULL",
    "DROP INDEX IF EXISTS projections_state",  # (state, created_at DESC): the one below orders as it did
    "CREATE INDEX IF NOT EXISTS projections_state_listing"
    " ON projections (kind, state, created_at, stream_id, tenant, user, name)",
]
"""The indexes of the projections, on columns added since the first release too: made once the migrations
ran. Those that a query of one kind's states reads begin with `kind` (every query of jobs asks for some states);
`projections_state_listing` holds every column a listing orders by and filters on: a listing of some states
finds its page's rows in it alone (for each state, its rows in order, until the page is full), then reads the
table for their documents only (a job's is a KiB or more, and sorting every job of those states with its
document was most of a listing's time); a search, or a count by user, reads no document at all."""
RESHAPED_INDEXES = ["projections_state_tenant_created", "projections_state_listing"]
"""The indexes that gained `kind` as their first column: a file made before has them without it."""


def columns(conn: sqlite3.Connection, table: str = "projections") -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def kinded(conn: sqlite3.Connection) -> bool:
    """Whether both tables have their `kind` (a file made before kinds has neither)."""
    return "kind" in columns(conn) and "kind" in columns(conn, "events")


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the file to this release's schema: the columns it lacks, each migration in a transaction of its
    own, then the indexes. On a file that has them all, nothing changes."""
    have = columns(conn)
    for column, script in MIGRATIONS.items():
        if column not in have:
            conn.executescript(f"BEGIN IMMEDIATE; {script} COMMIT;")
    if not kinded(conn):
        add_kinds(conn)
    conn.executescript(";\n".join(INDEXES) + ";")


def add_kinds(conn: sqlite3.Connection) -> None:
    """A file made before streams had a kind: `kind` on events and projections, each stream's from its id's
    prefix and its projection's state (`kindbackfill.py`), those states renamed, the indexes that filter on it
    made again with it. One transaction, which another process that migrated the file first makes a no-op."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not kinded(conn):
            for sql, args in kind_statements(conn):
                conn.execute(sql, args)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def kind_statements(conn: sqlite3.Connection) -> Iterator[tuple[str, tuple[str, ...]]]:
    for table in ("events", "projections"):
        if "kind" not in columns(conn, table):  # (a table this release's SCHEMA just made has it)
            yield f"ALTER TABLE {table} ADD COLUMN kind TEXT NOT NULL DEFAULT '{JOB}'", ()
    renamed = "UPDATE projections SET kind = ?, state = ? WHERE kind = ? AND state = ?"
    for old, (kind, new) in RENAMED_STATES.items():
        yield renamed, (kind.value, new, JOB, old)
    flags = " ".join(f"WHEN json_extract(doc, '$.{flag}') THEN ?" for flag, _ in NODE_FLAGS)
    yield (
        f"UPDATE projections SET kind = ?, state = CASE {flags} ELSE ? END WHERE kind = ? AND state = ?",
        (StreamKind.NODE.value, *(state for _, state in NODE_FLAGS), NODE_READY, JOB, NODE_CONTROL),
    )
    for prefix, kind in ID_PREFIXES.items():
        yield (
            "UPDATE events SET kind = ? WHERE stream_id >= ? AND stream_id < ?",
            (kind.value, *id_range(prefix)),
        )
    for index in RESHAPED_INDEXES:
        yield f"DROP INDEX IF EXISTS {index}", ()
    for sql in INDEXES:
        yield sql, ()
