"""`gpuyard admin backup` / `restore` on their own: private modes, a consistent copy of a live store, and
the refusals (a non-empty or running data directory, an archive that is not a backup)."""

from __future__ import annotations

import fcntl
import io
import os
import stat
import tarfile

import pytest

from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import LogKey, open_log_store, split
from gpuyard.supervisor.backup import BackupError, backup, restore


async def platform_state(data_dir):
    """A data directory as a running platform leaves it: live WAL stores, tokens, bus credentials."""
    store = await open_store(f"sqlite:///{data_dir / 'events.db'}")
    logs = await open_log_store(f"sqlite:///{data_dir / 'logs.db'}")
    ledger = JobLedger(store, None, "/test")
    for k in range(3):
        data = JobSubmitted(job_id=f"j{k}", name="n", tenant="t", user="u", spec=JobSpec(command="true"))
        await ledger.append(f"j{k}", data)
    await logs.append(split(LogKey("j0", 1, 0), 0, b"hello\n"))
    (data_dir / "tokens.json").write_text('{"tokens": {}}')
    (data_dir / "bus").mkdir()
    (data_dir / "bus" / "executor.creds").write_text("secret")
    (data_dir / "secrets").mkdir()
    (data_dir / "secrets" / "publish.key").write_text("signing")
    version = data_dir / "models" / "t" / "mlp" / "1"
    version.mkdir(parents=True)
    (version / "ab12.onnx").write_bytes(b"onnx bytes")
    (version / "ab12.onnx").chmod(0o444)  # (as the model store leaves a published version)
    return store, logs


async def test_a_backup_of_a_live_platform_restores_every_event_with_private_modes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    store, logs = await platform_state(data)
    try:  # the stores stay open (WAL, not checkpointed) while the backup is taken
        archive = tmp_path / "b.tar.gz"
        summary = backup(data, archive)
    finally:
        await store.close()
        await logs.close()
    assert (summary.jobs, summary.events) == (3, 3)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive) as tar:
        assert {m.name: stat.S_IMODE(m.mode) for m in tar.getmembers()} == {
            "events.db": 0o600,
            "logs.db": 0o600,
            "tokens.json": 0o600,
            "bus": 0o700,
            "bus/executor.creds": 0o600,
            "secrets": 0o700,
            "secrets/publish.key": 0o600,
            "models": 0o700,
            "models/t": 0o700,
            "models/t/mlp": 0o700,
            "models/t/mlp/1": 0o700,
            "models/t/mlp/1/ab12.onnx": 0o600,
            "gpuyard-backup.json": 0o600,
        }

    new = tmp_path / "new" / "data"
    restore(archive, new)
    assert stat.S_IMODE(new.stat().st_mode) == 0o700
    for path in new.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert (new / "bus" / "executor.creds").read_text() == "secret"
    assert (new / "secrets" / "publish.key").read_text() == "signing"
    assert (new / "models" / "t" / "mlp" / "1" / "ab12.onnx").read_bytes() == b"onnx bytes"
    again = await open_store(f"sqlite:///{new / 'events.db'}")
    restored_logs = await open_log_store(f"sqlite:///{new / 'logs.db'}")
    try:
        assert [len(await again.read_stream(f"j{k}")) for k in range(3)] == [1, 1, 1]
        assert await restored_logs.keys("j0") == [LogKey("j0", 1, 0)]
    finally:
        await again.close()
        await restored_logs.close()


async def test_restore_refuses_a_data_directory_in_use_or_not_empty_and_foreign_archives(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    store, logs = await platform_state(data)
    await store.close()
    await logs.close()
    archive = tmp_path / "b.tar.gz"
    backup(data, archive)

    with pytest.raises(BackupError, match="not empty"):
        restore(archive, data)
    running = tmp_path / "running"
    running.mkdir()
    with open(running / "up.lock", "w") as lock:  # noqa: ASYNC230
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `gpuyard up` holds it
        with pytest.raises(BackupError, match="platform runs"):
            restore(archive, running)

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(BackupError, match="not part of a GPUYARD backup"):
        restore(evil, tmp_path / "fresh")
    assert not (tmp_path / "outside").exists()
    with pytest.raises(BackupError, match="no event store"):
        backup(tmp_path / "nothing", tmp_path / "x.tar.gz")
    assert not os.path.exists(tmp_path / "x.tar.gz")
