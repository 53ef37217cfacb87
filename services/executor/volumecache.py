"""Volumes in an object store (`GPUYARD_VOLUME_STORE`), copied to the node before a replica of the local backend
starts (docs/volumes.md): `<storage root>/volume-cache/<tenant>/<name>/`, kept between jobs, and mounted
read-only as a volume's folder is (`volumemounts.py`).

A copy fetches only the objects new or changed since the last one (by size and ETag, or the time they were
written where a store has no ETag: `<name>.manifest.json` beside the folder says what each file was copied from)
and removes the files whose objects are gone. Each file is written under a temporary name and renamed into
place: a copy cut short leaves whole files. The copy blocks: `fetch` runs it in a thread, one at a time per
volume. The cache is the platform's, closed to other tenants: its folder is 0750 and of the tenant's jobs'
group (read, never written, by them), the folders above 0711."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuyard.services.executor.volumemounts import Cached
from gpuyard.shared.contracts.jobspec import VolumeMount
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.objectstore import files_under, filesystem, mtime_of
from gpuyard.shared.runtime.paths import VOLUMES
from gpuyard.shared.runtime.tarstream import CHUNK, PathRefused, clean_path

VOLUME_CACHE = "volume-cache"


class CacheError(Exception):
    """A volume that could not be copied; the message says why (the start fails with it)."""


@dataclass(frozen=True)
class Copied:
    """What one copy did: the files it fetched and their bytes, the files the volume has, how long it took."""

    fetched: int
    bytes: int
    files: int
    seconds: float

    def note(self, name: str) -> str:
        return (
            f"volume {name}: copied {self.fetched} file{'' if self.fetched == 1 else 's'} ({format_size(self.bytes)}) from the object store in "
            f"{self.seconds:.1f}s"
        )


class VolumeCache:
    """The node's copies of volumes in the object store `url`, under `<root>/volume-cache/`."""

    def __init__(self, url: str, root: Path | str, owner_of: Callable[[str], JobUser | None]):
        self.url = url.rstrip("/")
        self.root = Path(root)
        self.owner_of = owner_of
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def folder(self, tenant: str, name: str) -> Path:
        return self.root / VOLUME_CACHE / tenant / name

    async def fetch(self, volumes: list[VolumeMount], tenant: str) -> Cached:
        """Each volume copied (what changed since the last copy), off the event loop: where each is, and a note
        of each copy. CacheError for one that could not be copied."""
        sources: dict[str, str] = {}
        notes: list[str] = []
        for name in dict.fromkeys(v.name for v in volumes):
            async with self._locks.setdefault((tenant, name), asyncio.Lock()):
                try:
                    copied = await asyncio.to_thread(self.sync, tenant, name)
                except Exception as exc:
                    raise CacheError(
                        f"cannot copy volume {name!r} from the object store: {type(exc).__name__}: {exc}"
                    ) from None
            sources[name] = str(self.folder(tenant, name))
            notes.append(copied.note(name))
        return Cached(sources, tuple(notes))

    def sync(self, tenant: str, name: str) -> Copied:
        """The volume's folder made the same as its objects: the new and changed fetched, the gone removed."""
        start = time.monotonic()
        fs, base = filesystem(self.url, "the volume store", fresh_listings=True)
        prefix = f"{base.rstrip('/')}/{VOLUMES}/{tenant}/{name}"
        remote = files_under(fs, prefix)
        folder = self._make_folder(tenant, name)
        manifest_path = folder.parent / f"{name}.manifest.json"
        manifest = _load(manifest_path)
        kept: dict[str, list] = {}
        fetched = size = 0
        for rel, info in sorted(remote.items()):
            try:
                clean = clean_path(rel)
            except PathRefused:
                continue  # (a key that is no path inside the volume: never copied)
            stamp = [int(info.get("size") or 0), str(info.get("ETag") or mtime_of(info))]
            local = folder / clean
            if manifest.get(clean, [None])[:2] == stamp and _same(local, manifest[clean]):
                kept[clean] = manifest[clean]
                continue
            _fetch(fs, f"{prefix}/{rel}", local)
            st = os.stat(local)
            kept[clean] = [*stamp, st.st_size, st.st_mtime_ns]
            fetched, size = fetched + 1, size + st.st_size
        _prune(folder, set(kept))
        _save(manifest_path, kept)
        return Copied(fetched, size, len(kept), time.monotonic() - start)

    def _make_folder(self, tenant: str, name: str) -> Path:
        """`volume-cache/<tenant>/<name>`: the folders above 0711, its own 0750 and of the tenant's jobs' group."""
        folder = self.folder(tenant, name)
        for step in (self.root, self.root / VOLUME_CACHE, folder.parent):
            with contextlib.suppress(FileExistsError):
                os.mkdir(step, 0o711)
                os.chmod(step, 0o711)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o750)
        user = self.owner_of(tenant)
        os.chown(folder, os.geteuid(), user.gid if user else os.getegid())
        os.chmod(folder, 0o750)
        return folder


def _same(local: Path, entry: list) -> bool:
    """Whether the file is still the one copied (its size and the time it was written)."""
    try:
        st = os.lstat(local)
    except OSError:
        return False
    return len(entry) == 4 and [st.st_size, st.st_mtime_ns] == entry[2:]


def _fetch(fs: Any, key: str, local: Path) -> None:
    """The object's bytes, a chunk at a time, to a temporary file renamed into place (0644)."""
    local.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if local.is_dir() and not local.is_symlink():
        shutil.rmtree(local)
    tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.part")
    try:
        with fs.open(key, "rb", block_size=CHUNK) as src, open(tmp, "xb") as out:
            shutil.copyfileobj(src, out, CHUNK)
        os.chmod(tmp, 0o644)
        os.replace(tmp, local)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _prune(folder: Path, keep: set[str]) -> None:
    """Remove the files (and then empty folders) that are not in `keep`."""
    for top, dirs, files in os.walk(folder, topdown=False):
        for entry in files:
            path = Path(top, entry)
            if path.relative_to(folder).as_posix() not in keep:
                path.unlink()
        for entry in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(Path(top, entry))  # (only when empty)


def _load(path: Path) -> dict[str, list]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _save(path: Path, manifest: dict[str, list]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)
