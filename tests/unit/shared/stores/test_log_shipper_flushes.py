"""Two flushes of the log shipper at once (the flusher's and the executor's when a replica exits): every byte
reaches the store once, a finished replica is forgotten once, and no flush fails."""

from __future__ import annotations

import asyncio

from gpuyard.shared.stores.logs import LogKey, open_log_store
from gpuyard.shared.stores.logs.reading import read_range
from gpuyard.shared.stores.logs.shipper import LogShipper


class HeldStore:
    """The SQLite log store, whose first append waits until the test lets it go (or fails then)."""

    def __init__(self, store, *, fail_first: bool = False) -> None:
        self.store = store
        self.fail_first = fail_first
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.appends = 0

    async def append(self, chunks) -> None:
        self.appends += 1
        if self.appends == 1:
            self.entered.set()
            await self.gate.wait()
            if self.fail_first:
                raise ConnectionError("the log store is away")
        await self.store.append(chunks)

    def __getattr__(self, name):
        return getattr(self.store, name)


async def two_flushes(shipper: LogShipper, store: HeldStore) -> list[BaseException | None]:
    """A first flush held in its append, a second one started meanwhile, then the first let go."""
    first = asyncio.create_task(shipper.flush())
    await store.entered.wait()
    second = asyncio.create_task(shipper.flush())
    store.gate.set()
    return await asyncio.gather(first, second, return_exceptions=True)


async def test_two_flushes_at_once_ship_a_finished_replica_once_and_both_succeed(tmp_path):
    sqlite = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    store = HeldStore(sqlite)
    shipper = LogShipper(store, interval=3600)
    key = LogKey("job", 1, 0)
    shipper.open(key)
    shipper.write(key, b"hello\n")
    shipper.close(key)
    assert await two_flushes(shipper, store) == [None, None]
    assert shipper.replicas == 0
    assert b"".join([p async for p in read_range(sqlite, key)]) == b"hello\n"
    await sqlite.close()


async def test_a_failed_append_during_a_second_flush_loses_no_output(tmp_path):
    sqlite = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    store = HeldStore(sqlite, fail_first=True)
    shipper = LogShipper(store, interval=3600)
    key = LogKey("job", 1, 0)
    shipper.open(key)
    shipper.write(key, b"last words\n")
    shipper.close(key)
    first, second = await two_flushes(shipper, store)
    assert isinstance(first, ConnectionError)
    assert second is None  # it waited for the first, then sent the bytes the first put back
    assert shipper.replicas == 0
    assert b"".join([p async for p in read_range(sqlite, key)]) == b"last words\n"
    await sqlite.close()


async def test_three_flushes_at_once_keep_the_output_in_order(tmp_path):
    flushes = 3
    sqlite = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    store = HeldStore(sqlite)
    shipper = LogShipper(store, interval=3600)
    key = LogKey("job", 1, 0)
    shipper.open(key)
    shipper.write(key, b"one\n")
    first = asyncio.create_task(shipper.flush())
    await store.entered.wait()
    shipper.write(key, b"two\n")  # written while the first append is under way
    shipper.close(key)
    others = [asyncio.create_task(shipper.flush()) for _ in range(flushes - 1)]
    store.gate.set()
    assert await asyncio.gather(first, *others, return_exceptions=True) == [None] * flushes
    assert shipper.replicas == 0
    assert b"".join([p async for p in read_range(sqlite, key)]) == b"one\ntwo\n"
    await sqlite.close()
