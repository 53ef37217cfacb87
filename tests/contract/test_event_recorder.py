"""The contract of recording events (`EventRecorder`), for every event store adapter (`eventstores.py`):
append-only streams with optimistic concurrency, idempotent appends, the kind of each stream, the outbox."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.shared.stores.events import (
    Append,
    ConcurrencyError,
    StreamKind,
    StreamKindError,
    open_store,
)
from tests.contract.conftest import EVENT_STORE_BACKENDS
from tests.contract.eventstores import event_store, placed, submitted


@pytest.fixture(params=EVENT_STORE_BACKENDS)
async def store(request, tmp_path):
    async with event_store(request, tmp_path) as s:
        yield s


async def test_append_then_read_in_order(store):
    e1, e2 = submitted("a"), placed("a")
    assert (await store.append("a", 0, [e1])).version == 1
    assert (await store.append("a", 1, [e2])).version == 2
    events = await store.read_stream("a")
    assert [(s.version, s.event) for s in events] == [(1, e1), (2, e2)]
    assert await store.read_stream("unknown") == []
    assert [(s.version, s.event) for s in await store.read_stream("a", after_version=1)] == [(2, e2)]
    assert await store.read_stream("a", after_version=2) == []


async def test_a_stale_expected_version_is_a_conflict_never_an_overwrite(store):
    await store.append("a", 0, [submitted("a")])
    with pytest.raises(ConcurrencyError) as exc:
        await store.append("a", 0, [placed("a")])
    assert (exc.value.expected, exc.value.actual) == (0, 1)
    with pytest.raises(ConcurrencyError):
        await store.append("a", 5, [placed("a")])  # ahead of the stream: no gaps either
    assert len(await store.read_stream("a")) == 1


async def test_concurrent_writers_of_one_version_one_wins(store):
    await store.append("a", 0, [submitted("a")])
    results = await asyncio.gather(
        *(store.append("a", 1, [placed("a", f"p{i}")]) for i in range(5)), return_exceptions=True
    )
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if isinstance(r, Exception))
    assert len(await store.read_stream("a")) == 2


async def test_appending_the_same_event_again_changes_nothing(store):
    event = submitted("a")
    await store.append("a", 0, [event])
    again = await store.append("a", 0, [event])
    assert again.duplicate and again.version == 1
    assert len(await store.read_stream("a")) == 1


async def test_a_stream_keeps_the_kind_it_was_made_with(store):
    """A stream's kind is given by its first append; an append of another kind is a bug, refused whole."""
    await store.append("/idle/a", 0, [placed("a", "warned")], kind=StreamKind.IDLE)
    with pytest.raises(StreamKindError) as exc:
        await store.append("/idle/a", 1, [placed("a", "as-a-job")])
    assert (exc.value.kind, exc.value.held) == (StreamKind.JOB, StreamKind.IDLE)
    with pytest.raises(StreamKindError):
        await store.append_many([Append("/idle/a", 1, [placed("a", "as-a-node")], kind=StreamKind.NODE)])
    assert await store.append("/idle/a", 1, [placed("a", "again")], kind=StreamKind.IDLE)
    assert [s.event.id for s in await store.read_stream("/idle/a")] == ["warned", "again"]
    again = await store.append("/idle/a", 0, [placed("a", "warned")], kind=StreamKind.IDLE)
    assert again.duplicate and again.version == 2


async def test_outbox_lists_unpublished_events_of_every_kind_until_marked(store):
    e1, e2, e3 = submitted("a"), placed("a"), placed("a", "idle-warning")
    await store.append("a", 0, [e1])
    await store.append("a", 1, [e2])
    await store.append("/idle/a", 0, [e3], kind=StreamKind.IDLE)
    assert [e.id for e in await store.unpublished(older_than=0)] == [e1.id, e2.id, e3.id]
    assert await store.unpublished(older_than=3600) == []
    await store.mark_published([e1.id, e3.id])
    await store.mark_published([])
    assert [e.id for e in await store.unpublished(older_than=0)] == [e2.id]


async def test_two_handles_on_one_embedded_file_see_each_other(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = await open_store(url), await open_store(url)
    try:
        await a.append("x", 0, [submitted("x")])
        with pytest.raises(ConcurrencyError):
            await b.append("x", 0, [placed("x")])
        assert len(await b.read_stream("x")) == 1
    finally:
        await a.close()
        await b.close()


async def test_append_many_checks_each_stream_on_its_own(store):
    await store.append("a", 0, [submitted("a")])
    await store.append("b", 0, [submitted("b")])
    dup = submitted("d")
    await store.append("d", 0, [dup])
    results = await store.append_many(
        [
            Append("a", 1, [placed("a")]),  # right version: goes in
            Append("b", 0, [placed("b")]),  # stale: refused in its place, the others still go in
            Append("c", 0, [submitted("c")]),  # a new stream
            Append("d", 0, [dup]),  # already stored: a duplicate, nothing changes
            Append("/idle/c", 0, [placed("c", "idle-c")], kind=StreamKind.IDLE),  # another kind's
        ]
    )
    assert [type(r).__name__ for r in results] == [
        "AppendResult",
        "ConcurrencyError",
        "AppendResult",
        "AppendResult",
        "AppendResult",
    ]
    assert results[0].version == 2 and results[2].version == 1 and results[3].duplicate
    assert (results[1].expected, results[1].actual) == (0, 1)
    assert [len(await store.read_stream(s)) for s in [*"abcd", "/idle/c"]] == [2, 1, 1, 1, 1]
