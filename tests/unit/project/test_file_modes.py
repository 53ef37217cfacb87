"""The platform's files are its user's alone, whatever the umask it runs with: the stores and their WAL and
shared-memory files, replica logs and pid files, the tokens file are 0600, the folders made for them 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuyard.services.executor.logfile import RotatingLog
from gpuyard.services.executor.pidfiles import make_replica_dirs
from gpuyard.services.executor.reaper.files import write_atomically
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.paths import replica_files
from gpuyard.shared.stores.events.sqlite import SqliteEventStore
from gpuyard.shared.stores.logs.base import Chunk, LogKey
from gpuyard.shared.stores.logs.sqlite import SqliteLogStore


@pytest.fixture
def usual_umask():
    """The umask most shells give (0o022: files 0644), which left the platform's files readable by all."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def exposed(root: Path) -> list[str]:
    """Every file and folder under `root` (itself not included) that its group or others may use."""
    return [
        f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p.relative_to(root)}"
        for p in root.rglob("*")
        if not p.is_symlink() and p.lstat().st_mode & 0o077
    ]


async def test_the_stores_and_their_wal_files_are_private(tmp_path, usual_umask):
    events = await SqliteEventStore.open(tmp_path / "data" / "events.db")
    logs = await SqliteLogStore.open(tmp_path / "data" / "logs.db")
    try:
        data = JobSubmitted(job_id="j1", name="n", tenant="t", user="u", spec=JobSpec(command="true"))
        await events.append("job-j1", 0, [make_event(data, source="test")])
        await logs.append([Chunk(LogKey("j1", 1, 0), 0, b"a secret\n")])
        names = {p.name for p in (tmp_path / "data").iterdir()}
        assert {"events.db", "events.db-wal", "events.db-shm", "logs.db", "logs.db-wal"} <= names, names
        assert not exposed(tmp_path)
    finally:
        await events.close()
        await logs.close()


async def test_a_store_left_readable_by_an_earlier_version_is_made_private(tmp_path, usual_umask):
    for name in ("events.db", "events.db-wal"):
        (tmp_path / name).touch(0o644)
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await store.close()
    assert not exposed(tmp_path)


def test_replica_logs_pid_files_and_their_folders_are_private(tmp_path, usual_umask):
    files = replica_files(tmp_path / "data", "j1", 1, 0)
    make_replica_dirs(files)
    write_atomically(files.pid, {"pid": 1})  # as the reaper writes pid and exit files
    write_atomically(files.exit, {"status": 0})
    log = RotatingLog(files.log, max_bytes=10, backups=1)
    log.write(b"a secret line\n" * 3)  # and rotated
    log.close()
    RotatingLog(f"{tmp_path}/data/jobs/j2/attempt-1/replica-0.log", 0, 0).close()  # its folders made by it
    assert Path(files.log + ".1").exists()
    assert not exposed(tmp_path)


def test_the_tokens_file_is_private(tmp_path, usual_umask):
    Tokens(tmp_path / "conf" / "tokens.json").create(tenant="a")
    assert not exposed(tmp_path)
