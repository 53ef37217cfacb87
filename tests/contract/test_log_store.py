"""One contract suite for every log store adapter, and the readers and shipper built on it.

The embedded SQLite store always runs, and so does MongoDB's adapter on the stand-in (`mongo-standin`); on a
real server (`mongo-real`) where `tests/contract/conftest.py` finds or starts one, else those cases skip saying
why.
"""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.shared.stores.events import StoreUnavailable
from gpuyard.shared.stores.logs import (
    MAX_CHUNK,
    Chunk,
    Extent,
    LogKey,
    LogStore,
    log_store_url,
    open_log_store,
    split,
)
from gpuyard.shared.stores.logs.reading import follow, read_range, tail_start
from gpuyard.shared.stores.logs.shipper import LogShipper
from tests.contract.conftest import BACKENDS, SQLITE, failing, refused_url, server_url

A = LogKey("job-a", 1, 0)


@pytest.fixture(params=BACKENDS)
async def store(request, tmp_path) -> LogStore:
    if request.param == SQLITE:
        s = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    else:
        s = await open_log_store(server_url(request, request.param))
    yield s
    if request.param != SQLITE:
        await s.client.drop_database(s.chunks.database.name)
    await s.close()


async def text(store: LogStore, key: LogKey, start: int = 0, end: int | None = None) -> bytes:
    return b"".join([piece async for piece in read_range(store, key, start, end)])


async def test_chunks_read_back_in_order_and_cut_to_the_range(store):
    await store.append(split(A, 0, b"hello ") + split(A, 6, b"world\n"))
    assert await store.extent(A) == Extent(0, 12)
    assert await text(store, A) == b"hello world\n"
    assert await text(store, A, 3, 8) == b"lo wo"
    assert await store.extent(LogKey("job-a", 1, 1)) is None


async def test_a_chunk_sent_twice_is_stored_once(store):
    chunk = Chunk(A, 0, b"once\n")
    await store.append([chunk])
    await store.append([chunk, Chunk(A, 5, b"twice\n")])
    assert await text(store, A) == b"once\ntwice\n"


async def test_keys_list_every_replica_of_every_attempt(store):
    await store.append([Chunk(LogKey("j", 2, 1), 0, b"x"), Chunk(LogKey("j", 1, 0), 0, b"y")])
    await store.append([Chunk(LogKey("other", 1, 0), 0, b"z")])
    assert await store.keys("j") == [LogKey("j", 1, 0), LogKey("j", 2, 1)]


async def test_trim_and_delete_forget_old_output(store):
    data = bytes(range(256)) * (3 * MAX_CHUNK // 256)  # three full chunks
    await store.append(split(A, 0, data))
    await store.trim(A, 2 * MAX_CHUNK)
    extent = await store.extent(A)
    assert (extent.start, extent.end) == (2 * MAX_CHUNK, 3 * MAX_CHUNK)
    assert await text(store, A) == data[2 * MAX_CHUNK :]
    await store.delete_job("job-a")
    assert await store.keys("job-a") == []


async def test_appending_nothing_changes_nothing(store):
    await store.append([])
    assert await store.keys("job-a") == [] and await store.extent(A) is None


async def test_oversized_chunks_are_refused(store):
    with pytest.raises(ValueError):
        await store.append([Chunk(A, 0, b"x" * (MAX_CHUNK + 1))])


@pytest.mark.parametrize("lines, expected", [(1, b"line 9\n"), (3, b"line 7\nline 8\nline 9\n"), (0, b"")])
async def test_tail_finds_the_start_of_the_last_lines(store, lines, expected):
    body = b"".join(b"line %d\n" % i for i in range(10))
    await store.append([Chunk(A, i, body[i : i + 5]) for i in range(0, len(body), 5)])  # lines cross chunks
    start = await tail_start(store, A, lines, await store.extent(A))
    assert await text(store, A, start) == expected


async def test_tail_of_a_log_larger_than_a_step_and_without_a_last_newline(store):
    body = b"".join(b"%06d\n" % i for i in range(40_000)) + b"partial"  # 280 kB: several backward steps
    await store.append(split(A, 0, body))
    start = await tail_start(store, A, 2, await store.extent(A))
    assert await text(store, A, start) == b"039999\npartial"
    start = await tail_start(store, A, 50_000, await store.extent(A))
    assert start == 0


async def test_follow_reads_output_as_it_comes_until_the_end(store):
    finished = asyncio.Event()

    async def is_finished() -> bool:
        return finished.is_set()

    got: list[bytes] = []

    async def reader():
        async for piece in follow(store, A, 0, is_finished, poll=0.01):
            got.append(piece)

    task = asyncio.create_task(reader())
    await store.append([Chunk(A, 0, b"first\n")])
    async with asyncio.timeout(5):
        while not got:  # noqa: ASYNC110 - waits for the reader to see the first chunk
            await asyncio.sleep(0.01)
    await store.append([Chunk(A, 6, b"last\n")])
    finished.set()
    await asyncio.wait_for(task, 5)
    assert b"".join(got) == b"first\nlast\n"


async def test_the_shipper_batches_output_and_caps_each_replica(store):
    shipper = LogShipper(store, interval=3600, max_bytes=10)
    b = LogKey("job-b", 1, 0)
    shipper.open(A)
    shipper.open(b)
    for i in range(5):
        shipper.write(A, b"a%d\n" % i)
    shipper.write(b, b"b\n")
    shipper.write(LogKey("never-opened", 1, 0), b"ignored")
    await shipper.flush()
    assert await text(store, b) == b"b\n"
    assert (await store.extent(A)).end == 15
    assert (await text(store, A)).endswith(b"a3\na4\n")  # older output trimmed to the cap (whole chunks)
    shipper.write(A, b"more\n")
    shipper.close(A)
    await shipper.flush()
    assert (await store.extent(A)).end == 20 and shipper.replicas == 1  # closed and sent: forgotten
    assert await store.keys("never-opened") == []


async def test_the_shipper_keeps_output_while_the_store_is_down(store):
    class Down(Exception):
        pass

    real_append, calls = store.append, []

    async def failing(chunks):
        calls.append(chunks)
        if len(calls) == 1:
            raise Down("store unreachable")
        await real_append(chunks)

    store.append = failing
    shipper = LogShipper(store, interval=3600)
    shipper.open(A)
    shipper.write(A, b"kept\n")
    with pytest.raises(Down):
        await shipper.flush()
    shipper.write(A, b"after\n")
    await shipper.flush()
    assert await text(store, A) == b"kept\nafter\n"


def test_the_log_store_sits_beside_the_event_store():
    assert log_store_url("sqlite:////data/gpuyard/events.db") == "sqlite:////data/gpuyard/logs.db"
    assert log_store_url("mongodb://db/gpuyard?replicaSet=rs0") == "mongodb://db/gpuyard?replicaSet=rs0"


# MongoDB's own: a server that is not there or refuses


async def test_mongodb_an_unreachable_server_is_store_unavailable():
    from gpuyard.shared.stores.logs.mongo import MongoLogStore

    with refused_url() as url, pytest.raises(StoreUnavailable, match=f"cannot reach MongoDB at {url}"):
        await MongoLogStore.open(url, timeout_ms=200)


async def test_mongodb_a_server_that_refuses_is_store_unavailable_for_every_method(mongo_url):
    """What the API answers with a 503, and the shipper keeps its output for (never a driver's error)."""
    async with failing(mongo_url) as url:
        store = await open_log_store(url)
        calls = {
            "append": lambda: store.append([Chunk(A, 0, b"x")]),
            "extent": lambda: store.extent(A),
            "read": lambda: store.read(A, 0, 10),
            "keys": lambda: store.keys("job-a"),
            "trim": lambda: store.trim(A, 10),
            "delete_job": lambda: store.delete_job("job-a"),
        }
        wrong = {}
        try:
            for method, call in calls.items():
                try:
                    await call()
                    wrong[method] = "no error"
                except StoreUnavailable:
                    pass
                except Exception as exc:
                    wrong[method] = repr(exc)
        finally:
            await store.close()
        assert wrong == {}


async def test_mongodb_a_chunk_the_server_refuses_is_an_error_and_the_rest_is_stored(mongo_url):
    """A refusal other than a duplicate (here a document validator's) is never taken for a chunk stored
    already; the batch's other chunks are stored all the same (unordered)."""
    store = await open_log_store(mongo_url)
    try:
        await store.chunks.database.command("collMod", "log_chunks", validator={"job_id": {"$ne": "refused"}})
        await store.append([Chunk(A, 0, b"kept\n")])
        with pytest.raises(StoreUnavailable, match="MongoDB writing log chunks failed"):
            await store.append(
                [Chunk(A, 0, b"kept\n"), Chunk(LogKey("refused", 1, 0), 0, b"x"), Chunk(A, 5, b"also\n")]
            )
        assert await text(store, A) == b"kept\nalso\n"
        assert await store.keys("refused") == []
    finally:
        await store.close()
