"""What every event store adapter shares: the stored forms (events, projections, appends), the kind of a
stream, the page cursors, and the exceptions every adapter raises, so that callers never see a backend's own
errors. The interface itself is split by capability (`recorder.py`, `projections.py`, `documents.py`,
`retention.py`); `store.py`'s `EventStore` is all of them.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel

from gpuyard.shared.contracts.events.envelope import CloudEvent


class StoreError(Exception):
    """Base of the store's errors."""


class StreamKind(StrEnum):
    """What a stream holds, stored with its events and its projection: every query of jobs (listing, counting,
    versions, ends, id prefixes, retention) reads the streams of kind JOB alone, and each read model reads its
    own kind. A stream's id is unique across kinds (the other kinds' ids keep a prefix of their own: `model:`,
    `/alerts/`, `/nodes/`, `/idle/`, `volume:`), and its kind never changes."""

    JOB = "job"
    MODEL = "model"
    ALERT = "alert"
    NODE = "node"
    IDLE = "idle"
    VOLUME = "volume"


class StreamKindError(StoreError, ValueError):
    """An append of one kind to a stream of another: a bug of the writer, never retried."""

    def __init__(self, stream_id: str, kind: str, held: str):
        super().__init__(f"stream {stream_id} holds {held} events, not {kind} ones")
        self.stream_id, self.kind, self.held = stream_id, kind, held


class ConcurrencyError(StoreError):
    """The stream's version is not the one the writer expected: someone else wrote first. Reload and retry."""

    def __init__(self, stream_id: str, expected: int, actual: int):
        super().__init__(f"stream {stream_id}: expected version {expected}, found {actual}")
        self.stream_id, self.expected, self.actual = stream_id, expected, actual


RETRY_AFTER_SECONDS = 2
"""What a StoreUnavailable asks a caller to wait by default before it tries again."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached, or cannot write now: nothing was written. `reason` says why in one word
    (`unavailable`, `disk_full`: its disk or its size limit is full, `busy`: another writer held its lock for
    the whole lock timeout); `retry_after`: the seconds worth waiting before trying again (the API's 503 says
    them in Retry-After)."""

    def __init__(self, message: str, *, reason: str = "unavailable", retry_after: int = RETRY_AFTER_SECONDS):
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class StoreFull(StoreUnavailable):
    """The store cannot write: no space left on its disk (ENOSPC, SQLITE_FULL), or its size limit reached."""

    def __init__(self, message: str, *, retry_after: int = 30):
        super().__init__(message, reason="disk_full", retry_after=retry_after)


class StoreBusy(StoreUnavailable):
    """Another writer held the store's write lock for the whole lock timeout ("database is locked")."""

    def __init__(self, message: str, *, retry_after: int = 5):
        super().__init__(message, reason="busy", retry_after=retry_after)


SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL = 5, 6, 13  # SQLite's primary result codes
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def unavailable(
    what: str, exc: BaseException, *, lock_timeout: float | None = None
) -> StoreUnavailable | None:
    """The StoreUnavailable a backend's error stands for (`what`: the store, as errors name it): StoreFull for
    a full disk (ENOSPC, EDQUOT, SQLITE_FULL), StoreBusy for a write lock another writer held for the whole
    `lock_timeout` ("database is locked"), StoreUnavailable for any other failure to reach or write it (an I/O
    error, a file that cannot be opened); None for an error that is a bug, not the store's state (a constraint,
    a misuse of the API): it goes on as it is."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if isinstance(exc, OSError):
        if exc.errno in NO_SPACE:
            return StoreFull(f"{what} cannot write: no space left on its disk ({exc.strerror or exc})")
        return StoreUnavailable(f"{what}: {exc}")
    if not isinstance(exc, sqlite3.OperationalError) and type(exc) is not sqlite3.DatabaseError:
        return None
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    text = str(exc)
    if code == SQLITE_FULL or "database or disk is full" in text:
        return StoreFull(f"{what} cannot write: its disk is full ({text})")
    if code in (SQLITE_BUSY, SQLITE_LOCKED) or "locked" in text or "busy" in text:
        held = f" for {lock_timeout:g} s" if lock_timeout else ""
        return StoreBusy(f"{what} cannot write: another writer held its lock{held} ({text})")
    return StoreUnavailable(f"{what}: {text}")


class Outage:
    """Says once that a loop's writes fail (its store's disk full, its lock held, the store or the bus away),
    not at every try, and once that they succeed again: a loop that retries every half second logs two lines
    for an outage of any length, not one per try. A failure of another kind (another `reason`, another
    exception) met during the outage is said once too. `what`: the loop, as its lines name it."""

    def __init__(self, log: logging.Logger, what: str, *, clock: Callable[[], float] = time.monotonic):
        self.log = log
        self.what = what
        self.clock = clock
        self.since: float | None = None
        """When the first failure of the outage came; None: no outage."""
        self.failures = 0
        self._said: set[str] = set()

    @property
    def failing(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        if self.since is None:
            self.since = self.clock()
        self.failures += 1
        kind = getattr(exc, "reason", None) or type(exc).__name__
        if kind not in self._said:
            self._said.add(kind)
            self.log.warning(
                "%s: %s; tried again as before, and said again once it works (said once until then)",
                self.what,
                exc,
            )

    def succeeded(self) -> None:
        if self.since is None:
            return
        self.log.warning(
            "%s: resumed, after %.0f s and %d failed tries",
            self.what,
            self.clock() - self.since,
            self.failures,
        )
        self.since, self.failures = None, 0
        self._said.clear()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    stream_id: str
    version: int
    event: CloudEvent


@dataclass(frozen=True, slots=True)
class Projection:
    """The read model of one stream, stored with the events that produced it."""

    stream_id: str
    tenant: str
    state: str
    created_at: str  # ISO 8601, sorts chronologically
    version: int
    doc: BaseModel  # stored as its JSON form; read back as a dict
    ended_at: str | None = None
    """ISO 8601 time the job reached a final state; None while it can still change. Retention counts from it."""

    def doc_json(self) -> str:
        return self.doc.model_dump_json()

    def doc_dict(self) -> dict[str, Any]:
        return self.doc.model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class Append:
    """One stream's part of `append_many`."""

    stream_id: str
    expected_version: int
    events: list[CloudEvent]
    projection: Projection | None = None
    kind: StreamKind = StreamKind.JOB


@dataclass(frozen=True, slots=True)
class AppendResult:
    version: int  # the stream's version after the append
    duplicate: bool = False  # the events were already stored: nothing changed


@dataclass(frozen=True, slots=True)
class EndedJob:
    """A job that reached a final state (`Projections.ended_since`); times in ISO 8601."""

    stream_id: str
    tenant: str
    state: str
    ended_at: str
    submitted_at: str
    """When its first attempt was queued."""
    started_at: str | None
    """When its first attempt started running; None: it never ran."""


@dataclass(slots=True)
class Page:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None


Order = Literal["newest", "oldest"]
"""The order of a listing, by creation time (then stream id): newest first, or oldest first."""
SEARCH_MAX = 200
"""The longest `search` text a listing takes (the API refuses a longer one)."""


def encode_cursor(created_at: str, stream_id: str, order: Order = "newest") -> str:
    """Where the next page starts: after (`created_at`, `stream_id`), in `order` (a cursor of one order is
    refused by a listing in the other)."""
    mark = [created_at, stream_id] if order == "newest" else [created_at, stream_id, order]
    return base64.urlsafe_b64encode(json.dumps(mark).encode()).decode()


def decode_cursor(cursor: str, order: Order = "newest") -> tuple[str, str]:
    try:
        created_at, stream_id, *rest = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        made_for = rest[0] if rest else "newest"
    except (ValueError, TypeError) as exc:
        raise ValueError("invalid page cursor") from exc
    if rest[1:] or made_for != order:
        raise ValueError(f"invalid page cursor (one of another order than {order!r})")
    return str(created_at), str(stream_id)
