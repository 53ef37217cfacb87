"""A replica's reaper on a full disk: the exit file the disk refuses is written again at each turn of its loop
until the disk takes it (no partial file meanwhile), so a replica's end is never lost to a full disk."""

from __future__ import annotations

import errno
import json
import os
import socket

import pytest

from gpuyard.services.executor.reaper import files as reaper
from gpuyard.services.executor.reaper.files import write_atomically
from gpuyard.services.executor.reaper.loop import Reaper, Replica


@pytest.fixture
def reaper_of():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    made = Reaper(theirs)
    made.connected = False  # (no executor: nothing is sent)
    yield made
    for fd in (made.devnull, made.wakeup_r, made.wakeup_w):
        os.close(fd)
    ours.close()
    theirs.close()


WRITE = os.write


class Disk:
    """`os.write` for the reaper, refusing every write while `full`."""

    def __init__(self) -> None:
        self.full = True

    def write(self, fd: int, data) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return WRITE(fd, data)


def test_an_exit_file_the_disk_refuses_is_written_once_it_takes_it(reaper_of, tmp_path, monkeypatch):
    disk = Disk()
    monkeypatch.setattr(reaper.os, "write", disk.write)
    exit_file = tmp_path / "replica-0.exit"
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    reaper_of.finish(Replica(4242, str(exit_file), "", read_fd), 3)
    assert not exit_file.exists() and not (tmp_path / "replica-0.exit.tmp").exists()
    assert str(exit_file) in reaper_of.unwritten
    reaper_of.write_again()  # still full
    assert not exit_file.exists()
    disk.full = False
    reaper_of.write_again()
    monkeypatch.undo()
    assert json.loads(exit_file.read_text())["status"] == 3 and reaper_of.unwritten == {}


def test_an_exit_file_whose_folder_is_gone_is_not_tried_again(reaper_of, tmp_path):
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    reaper_of.finish(Replica(4242, str(tmp_path / "gone" / "replica-0.exit"), "", read_fd), 0)
    assert reaper_of.unwritten == {}


def test_write_atomically_leaves_no_partial_file_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(reaper.os, "write", Disk().write)
    with pytest.raises(OSError):
        write_atomically(str(tmp_path / "f.exit"), {"status": 0})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
