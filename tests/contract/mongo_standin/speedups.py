"""mongomock made linear where the contract suites need it, with mongomock's own answers (it is pinned: these
replace two of its internals). A GPU history compaction reads, merges and deletes tens of thousands of samples,
which took minutes:

- `$in`: mongomock scans the list of values for every document it filters (and rebuilds a list of regex
  flags each time): documents x values. Here a set of the values is built once per list and each document's
  value looked up in it; mongomock's own `$in` answers where a value has no hashable form or is a regular
  expression. Equality is Python's, as in mongomock's scan (a set finds what `==` finds: 1 and 1.0 alike,
  documents whatever their fields' order).
- A cursor: mongomock's iterator slices the whole result again (skip, limit) for every document it hands out
  (its own `delete_many` and `update_many` iterate one too): results x results. Here the slice is taken once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from bson.regex import Regex
from mongomock import filtering
from mongomock.collection import Cursor

_mongomock_in = filtering._in_op
_CACHED = 8
_cache: OrderedDict[int, tuple[list[Any], frozenset[Any] | None]] = OrderedDict()


class _Unhashable(Exception):
    pass


def _frozen(value: Any) -> Any:
    """A hashable form of a BSON value that equals another's exactly when the values are equal (`==`)."""
    if isinstance(value, dict):
        return frozenset((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, re.Pattern | Regex):
        raise _Unhashable
    try:
        hash(value)
    except TypeError as exc:
        raise _Unhashable from exc
    return value


def _values(search: list[Any]) -> frozenset[Any] | None:
    """The set of a `$in` list's values (None: mongomock's scan must answer), built once per list."""
    held = _cache.get(id(search))
    if held is not None and held[0] is search:
        return held[1]
    try:
        values: frozenset[Any] | None = frozenset(_frozen(v) for v in search)
    except _Unhashable:
        values = None
    _cache[id(search)] = (search, values)
    while len(_cache) > _CACHED:
        _cache.popitem(last=False)
    return values


def _in(doc_value: Any, search: Any) -> bool:
    values = _values(search) if isinstance(search, list) else None
    if values is None or doc_value is filtering.NOTHING:
        return _mongomock_in(doc_value, search)
    try:
        return any(
            _frozen(v) in values for v in (doc_value if isinstance(doc_value, list | tuple) else [doc_value])
        )
    except _Unhashable:
        return _mongomock_in(doc_value, search)


def _next(cursor: Cursor) -> dict[str, Any]:
    """The next document of a mongomock cursor, from its result sliced once (per result, skip and limit)."""
    results = cursor._compute_results()  # (the whole result: computed once per query, never copied)
    window = cursor.__dict__.get("_sliced")
    if window is None or window[0] is not results or window[1] != (cursor._skip, cursor._limit):
        sliced = results[cursor._skip :]
        window = (
            results,
            (cursor._skip, cursor._limit),
            sliced[: abs(cursor._limit)] if cursor._limit else sliced,
        )
        cursor._sliced = window
    if cursor._emitted >= len(window[2]):
        raise StopIteration
    cursor._emitted += 1
    return window[2][cursor._emitted - 1]


def install() -> None:
    """Give mongomock's filterer this `$in` (and `$nin`, its negation) and its cursors this iterator;
    idempotent."""
    operators = filtering._filterer_inst._operator_map
    operators["$in"] = _in
    operators["$nin"] = lambda doc_value, search: not _in(doc_value, search)
    Cursor.__next__ = _next
    Cursor.next = _next
