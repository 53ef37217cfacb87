"""Server-side cursors: a result handed out in batches, as a server does (the driver's getMore path runs)."""

from __future__ import annotations

import itertools
from typing import Any

import bson
from bson.int64 import Int64

FIRST_BATCH = 101
"""Documents in a first batch that names no size (the server's default)."""
MAX_BATCH_BYTES = 16 * 1024 * 1024


class Cursors:
    def __init__(self) -> None:
        self._open: dict[int, tuple[str, list[dict[str, Any]]]] = {}
        self._ids = itertools.count(1)

    def first(self, ns: str, docs: list[dict[str, Any]], batch_size: int | None, single: bool = False):
        """The `cursor` field of a find's or an aggregate's reply; the rest is kept for getMore."""
        count = len(docs) if single else (batch_size or FIRST_BATCH)
        batch, rest = _batch(docs, count)
        cursor_id = 0
        if rest and not single:
            cursor_id = next(self._ids)
            self._open[cursor_id] = (ns, rest)
        return {"id": Int64(cursor_id), "ns": ns, "firstBatch": batch}

    def more(self, cursor_id: int, batch_size: int | None) -> dict[str, Any] | None:
        """The `cursor` field of a getMore's reply; None for a cursor that is not open."""
        if cursor_id not in self._open:
            return None
        ns, docs = self._open.pop(cursor_id)
        batch, rest = _batch(docs, batch_size or len(docs))
        if rest:
            self._open[cursor_id] = (ns, rest)
        return {"id": Int64(cursor_id if rest else 0), "ns": ns, "nextBatch": batch}

    def kill(self, cursor_ids: list[int]) -> tuple[list[int], list[int]]:
        """(killed, not found)."""
        killed = [c for c in cursor_ids if self._open.pop(c, None) is not None]
        return killed, [c for c in cursor_ids if c not in killed]


def _batch(docs: list[dict[str, Any]], count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Up to `count` documents and MAX_BATCH_BYTES (at least one), and what is left."""
    size, taken = 0, 0
    for doc in docs[:count]:
        size += len(bson.encode(doc))
        if taken and size > MAX_BATCH_BYTES:
            break
        taken += 1
    return docs[:taken], docs[taken:]
