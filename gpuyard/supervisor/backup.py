"""`gpuyard admin backup` and `restore`: the platform's state as one private archive, taken while it runs.

What an archive holds (and why nothing else):
- `events.db`, `logs.db`: the event store and the log store, each copied with SQLite's online backup API (a
  consistent snapshot of a live WAL database; a copy of its files could catch a half-written transaction);
- `tokens.json` (written atomically, so a plain read is consistent), the bus credentials (`bus/`), the
  secret jobs' publish tokens are signed with (`secrets/`) and the model store's artifacts (`models/`, when the
  store is the data directory's: published versions are immutable files, written whole), if any;
- `gpuyard-backup.json`: what was copied, when, and how many jobs and events.

Not the JetStream store (`nats/`): the bus is the transport and the event store the truth. Every event in the
store was published or is published again by the outbox relay; on start the services declare the streams,
the scheduler reads the live jobs from the store and the executor reconciles what was placed on its node, so
a restored platform goes on from the store alone. Dead letters and consumers' positions are not kept. Nor the
node's job directories (`jobs/`): the output the API serves is in `logs.db`; working directories are the
jobs' own, often large, and copied with the machine's own tools if wanted.

Every member is 0600 (folders 0700) and the archive is 0600; `restore` writes into an empty data directory
only (never over a platform's state, never while `gpuyard up` holds its lock), with the same modes.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import sqlite3
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO

from gpuyard.shared.auth.jobtokens import SECRETS_DIR
from gpuyard.shared.modelfiles.store import MODELS_DIR
from gpuyard.shared.runtime.paths import PRIVATE_FILE, private_dir

MANIFEST = "gpuyard-backup.json"
DATABASES = ("events.db", "logs.db")
FILES = ("tokens.json",)
DIRECTORIES = ("bus", SECRETS_DIR, MODELS_DIR)
"""Folders copied whole (the bus credentials, the publish secret, the models' artifacts)."""
LOCK = "up.lock"
FORMAT = 1


class BackupError(Exception):
    """The backup or restore cannot be done; the message says why."""


@dataclass(frozen=True, slots=True)
class Summary:
    files: list[str]
    jobs: int
    events: int


def _copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite database (WAL included) through the online backup API."""
    src = sqlite3.connect(source, timeout=30)
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file in the archive
        finally:
            dst.close()
    finally:
        src.close()


def _count(events_db: Path) -> tuple[int, int]:
    conn = sqlite3.connect(events_db)
    try:
        jobs = conn.execute("SELECT COUNT(*) FROM projections").fetchone()[0]
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        return jobs, events
    except sqlite3.Error:
        return 0, 0
    finally:
        conn.close()


def _info(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 0 if directory else size
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o700 if directory else PRIVATE_FILE
    info.mtime = int(time.time())
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def backup(data_dir: Path, out: Path) -> Summary:
    """Write the archive of `data_dir`'s state to `out` (0600, replaced whole once complete)."""
    data_dir = data_dir.expanduser()
    if not (data_dir / "events.db").exists():
        raise BackupError(f"{data_dir} holds no event store (events.db): is it a GPUYARD data directory?")
    files: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuyard-backup-") as tmp:  # 0700
        staged = Path(tmp)
        for name in DATABASES:
            if (data_dir / name).exists():
                _copy_database(data_dir / name, staged / name)
                files.append(name)
        jobs, events = _count(staged / "events.db")
        partial = out.with_name(f".{out.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        os.fchmod(fd, PRIVATE_FILE)
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                for name in files:
                    with open(staged / name, "rb") as f:
                        tar.addfile(_info(name, os.fstat(f.fileno()).st_size), f)
                for name in FILES:
                    if (data_dir / name).is_file():
                        data = (data_dir / name).read_bytes()
                        tar.addfile(_info(name, len(data)), io.BytesIO(data))
                        files.append(name)
                for directory in DIRECTORIES:
                    folder = data_dir / directory
                    if not folder.is_dir():
                        continue
                    tar.addfile(_info(directory, 0, directory=True))
                    for path in sorted(folder.rglob("*")):
                        name = path.relative_to(data_dir).as_posix()
                        if path.is_dir() and not path.is_symlink():
                            tar.addfile(_info(name, 0, directory=True))
                        elif path.is_file() and not path.is_symlink():
                            with open(path, "rb") as f:  # (streamed: a model may be large)
                                tar.addfile(_info(name, os.fstat(f.fileno()).st_size), f)
                            files.append(name)
                manifest = json.dumps(
                    {
                        "format": FORMAT,
                        "created": datetime.now(UTC).isoformat(),
                        "data_dir": str(data_dir.resolve()),
                        "files": files,
                        "jobs": jobs,
                        "events": events,
                    },
                    indent=2,
                ).encode()
                tar.addfile(_info(MANIFEST, len(manifest)), io.BytesIO(manifest))
            os.replace(partial, out)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return Summary(files, jobs, events)


def _refuse_if_running(data_dir: Path) -> None:
    lock = data_dir / LOCK
    if not lock.exists():
        return
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(
                f"a platform runs on {data_dir} (`gpuyard up` holds its lock): stop it"
            ) from None
        fcntl.flock(f, fcntl.LOCK_UN)


def _member_path(member: tarfile.TarInfo) -> PurePosixPath:
    path = PurePosixPath(member.name)
    allowed = member.name in (*DATABASES, *FILES, MANIFEST) or (
        path.parts[:1] in {(d,) for d in DIRECTORIES} and len(path.parts) <= 8
    )
    if path.is_absolute() or ".." in path.parts or not allowed or not (member.isfile() or member.isdir()):
        raise BackupError(f"{member.name!r} is not part of a GPUYARD backup: refusing the archive")
    return path


def _member_file(tar: tarfile.TarFile, member: tarfile.TarInfo, archive: Path) -> IO[bytes]:
    """The content of `member`, a file of the archive."""
    content = tar.extractfile(member)
    if content is None:
        raise BackupError(f"{member.name!r} of {archive} is not a file: refusing the archive")
    return content


def restore(archive: Path, data_dir: Path) -> Summary:
    """Unpack `archive` into `data_dir`, which must be empty (or not exist) and not in use."""
    data_dir = data_dir.expanduser()
    if data_dir.exists():
        _refuse_if_running(data_dir)
        if any(data_dir.iterdir()):
            raise BackupError(f"{data_dir} is not empty: restore into a new data directory")
    try:
        tar = tarfile.open(archive, mode="r:gz")  # noqa: SIM115 - closed by the `with tar` below
    except (OSError, tarfile.TarError) as exc:
        raise BackupError(f"cannot read {archive}: {exc}") from exc
    with tar:
        members = tar.getmembers()
        paths = [_member_path(m) for m in members]
        if MANIFEST not in {m.name for m in members}:
            raise BackupError(f"{archive} has no {MANIFEST}: not a GPUYARD backup")
        manifest = json.loads(_member_file(tar, tar.getmember(MANIFEST), archive).read())
        if manifest.get("format") != FORMAT:
            raise BackupError(f"{archive} is a backup of format {manifest.get('format')}, not {FORMAT}")
        private_dir(data_dir)
        for member, path in zip(members, paths, strict=True):
            if member.name == MANIFEST:
                continue
            target = data_dir.joinpath(*path.parts)
            if member.isdir():
                private_dir(target)
                continue
            private_dir(target.parent)
            source = _member_file(tar, member, archive)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            with os.fdopen(fd, "wb") as f:
                while chunk := source.read(1 << 20):
                    f.write(chunk)
    return Summary(
        list(manifest.get("files", [])), int(manifest.get("jobs", 0)), int(manifest.get("events", 0))
    )
