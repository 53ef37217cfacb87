"""Replica logs: the executor's rotating writer on the node, and what it ships to the log store, where the API
reads and follows it."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.services.executor.logfile import RotatingLog, tail_lines
from gpuyard.shared.runtime.paths import log_files, log_path
from gpuyard.shared.stores.logs import LogKey, open_log_store
from gpuyard.shared.stores.logs.reading import follow, read_range, tail_start
from gpuyard.shared.stores.logs.shipper import LogShipper


def lines(n: int, start: int = 1) -> bytes:
    return b"".join(f"line-{i:05d}\n".encode() for i in range(start, start + n))


def test_rotation_keeps_the_newest_files_under_the_cap(tmp_path):
    path = tmp_path / "replica-0.log"
    log = RotatingLog(path, max_bytes=120, backups=3)
    log.write(lines(100))  # 11 bytes a line: 10 lines a file
    log.close()
    files = log_files(path)
    assert [f.name for f in files] == [
        "replica-0.log.3",
        "replica-0.log.2",
        "replica-0.log.1",
        "replica-0.log",
    ]
    assert all(f.stat().st_size <= 120 for f in files)
    assert b"".join(f.read_bytes() for f in files) == lines(40, start=61)  # whole lines, newest 40
    assert tail_lines(path, 3) == ["line-00098", "line-00099", "line-00100"]


def test_a_line_longer_than_a_file_is_split_and_no_byte_is_lost(tmp_path):
    path = tmp_path / "r.log"
    log = RotatingLog(path, max_bytes=10, backups=10)
    log.write(b"x" * 25 + b"\n")
    log.close()
    assert b"".join(f.read_bytes() for f in log_files(path)) == b"x" * 25 + b"\n"


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot be negative"):
        RotatingLog(tmp_path / "r.log", max_bytes=-1, backups=1)


async def test_a_shipped_log_reaches_the_store_whole_across_rotations(tmp_path):
    store = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    shipper = LogShipper(store, interval=3600)
    key = LogKey("job", 1, 0)
    log = RotatingLog(log_path(tmp_path, "job", 1, 0), max_bytes=55, backups=1, shipper=shipper, key=key)
    log.write(lines(20))  # rotated three times: the node keeps the newest files only, the store all of it
    log.close()
    await shipper.flush()
    assert shipper.replicas == 0  # closed and sent: forgotten
    assert b"".join([p async for p in read_range(store, key)]) == lines(20)
    start = await tail_start(store, key, 7, await store.extent(key))
    assert b"".join([p async for p in read_range(store, key, start)]) == lines(7, start=14)
    assert await store.extent(LogKey("job", 1, 1)) is None  # a replica without output yet
    await store.close()


async def test_a_log_written_before_an_executor_restart_is_shipped_on_from_its_end(tmp_path):
    store = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    shipper = LogShipper(store, interval=3600)
    key, path = LogKey("job", 1, 0), log_path(tmp_path, "job", 1, 0)
    first = RotatingLog(path, max_bytes=0, backups=0, shipper=shipper, key=key)
    first.write(lines(3))
    await shipper.flush()
    first.close()
    await shipper.flush()
    again = RotatingLog(path, max_bytes=0, backups=0, shipper=shipper, key=key)  # the new executor's
    again.write(lines(2, start=4))
    again.close()
    await shipper.flush()
    assert b"".join([p async for p in read_range(store, key)]) == lines(5)
    await store.close()


async def test_following_the_store_while_the_replica_writes(tmp_path):
    store = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
    shipper = LogShipper(store, interval=0.01)
    shipper.start()
    key = LogKey("job", 1, 0)
    log = RotatingLog(log_path(tmp_path, "job", 1, 0), max_bytes=200, backups=0, shipper=shipper, key=key)
    done = asyncio.Event()

    async def write():
        for i in range(1, 301):
            log.write(lines(1, start=i))
            if i % 10 == 0:
                await asyncio.sleep(0.005)  # the node's file rotates many times meanwhile
        log.close()
        await shipper.stop()
        done.set()

    async def finished() -> bool:
        return done.is_set()

    writer = asyncio.create_task(write())
    got = b"".join([chunk async for chunk in follow(store, key, 0, finished, poll=0.02)])
    await writer
    assert got == lines(300)  # in order, none twice, none lost, to the end
    await store.close()
