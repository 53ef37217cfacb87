"""Replica logs on disk: the executor's rotating writer and the submit API's reader and follower."""

from __future__ import annotations

import asyncio

import pytest

from services.executor.logfile import RotatingLog, tail_lines
from services.submit.logs import follow_log, read_log
from shared.paths import log_files, log_path


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


def test_reading_serves_the_rotated_files_oldest_first_and_tails_across_them(tmp_path):
    path = log_path(tmp_path, "job", 1, 0)
    log = RotatingLog(path, max_bytes=55, backups=5)
    log.write(lines(20))
    log.close()
    assert read_log(tmp_path, "job", 1, 0, None) == lines(20).decode()
    assert read_log(tmp_path, "job", 1, 0, 7) == lines(7, start=14).decode()
    assert read_log(tmp_path, "job", 1, 1, None) == ""  # a replica without output yet


@pytest.mark.parametrize("backups", [0, 2, 50])
async def test_following_goes_on_across_rotations(tmp_path, backups):
    path = log_path(tmp_path, "job", 1, 0)
    log = RotatingLog(path, max_bytes=200, backups=backups)
    done = asyncio.Event()

    async def write():
        for i in range(1, 301):
            log.write(lines(1, start=i))
            if i % 10 == 0:
                await asyncio.sleep(0.005)  # several rotations between two polls of the follower
        log.close()
        done.set()

    async def finished() -> bool:
        return done.is_set()

    writer = asyncio.create_task(write())
    got = b"".join([chunk async for chunk in follow_log(tmp_path, "job", 1, 0, None, finished, poll=0.02)])
    await writer
    numbers = [int(line.removeprefix("line-")) for line in got.decode().split()]
    assert numbers == sorted(set(numbers)) and numbers[-1] == 300  # in order, none twice, to the end
    if backups == 50:
        assert numbers == list(range(1, 301))  # everything was kept, so everything was followed
    else:
        assert len(numbers) >= 200 // 11  # at least what the cap keeps


async def test_following_from_the_start_serves_older_rotated_output_first(tmp_path):
    path = log_path(tmp_path, "job", 1, 0)
    log = RotatingLog(path, max_bytes=100, backups=10)
    log.write(lines(30))

    async def finished() -> bool:
        return True

    got = b"".join([chunk async for chunk in follow_log(tmp_path, "job", 1, 0, None, finished)])
    assert got == lines(30)
    tailed = b"".join([chunk async for chunk in follow_log(tmp_path, "job", 1, 0, 2, finished)])
    assert tailed == lines(2, start=29)
    log.close()
