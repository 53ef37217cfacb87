"""Volumes in an object store (`GPUYARD_VOLUME_STORE=s3://bucket/prefix`, or any fsspec URL): a volume's files
are the objects under `<prefix>/volumes/<tenant>/<name>/`, its folders the prefixes their keys imply (an
object store keeps no empty folder). The API's routes reach them through `VolumeFiles` (`volumefiles.py`).

Both ways stream: a download reads an object a chunk at a time, an upload is written as it comes (s3fs sends
it in parts of `PART_SIZE`: one part in memory, never the file whole). An upload is all or nothing, counted
against the room the volume has left as it comes. In S3 a file's upload is written straight to its key: a
multipart upload, which S3 shows whole when it is completed and never before, completed only once the checks
of `place_file` pass (aborted otherwise). Elsewhere, and for a tar stream, it goes to a staging key first
(`<prefix>/.staging/<id>/upload`), then into place: a file copied, a tree's files written from it to their keys
once every entry is checked (the tree becomes visible object by object in that last step). An upload cut short,
over the room left, or refused leaves nothing in the volume, and its staging objects are removed (`discard`);
those of a writer that died are swept by a later upload after a day.

Every key is built from a tenant and a volume name of the names' pattern and a path checked by `clean_path`
(relative, no `..`, no NUL): nothing outside the volume's prefix is ever named."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuyard.services.submit.volumefiles import (
    Staged,
    VolumeFiles,
    Written,
    check_name_lengths,
    checked_members,
)
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.runtime import objectfolder
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.objectfolder import ObjectFolder, ancestors
from gpuyard.shared.runtime.objectstore import S3_PROTOCOLS, files_under, filesystem, mtime_of
from gpuyard.shared.runtime.paths import VOLUMES
from gpuyard.shared.runtime.safefolder import NotThere
from gpuyard.shared.runtime.staleuploads import STALE_UPLOAD
from gpuyard.shared.runtime.tarstream import CHUNK, PathRefused
from gpuyard.shared.runtime.uploadfile import over_quota

log = logging.getLogger(__name__)

STAGING = ".staging"
PART_SIZE = 8 << 20
"""The part an upload is sent to S3 in (s3fs: one part in memory at a time; S3's least is 5 MiB)."""
_NAME = re.compile(NAME_PATTERN)


class ObjectUpload:
    """An upload written as it comes, refused past `room` bytes: to the staging object `<stage>/upload`, or
    straight to `key` (`direct`: an S3 multipart upload, seen by no one until `commit`)."""

    def __init__(self, fs: Any, stage: str, room: int, key: str | None = None):
        self.fs, self.stage, self.room = fs, stage, room
        self.direct = key is not None
        self.key = key or f"{stage}/upload"
        self.size = 0
        self._file = fs.open(self.key, "wb", block_size=PART_SIZE)
        self._open = True

    def write(self, chunk: bytes | bytearray) -> None:
        self.size += len(chunk)
        if self.size > self.room:
            raise over_quota(self.room)
        self._file.write(bytes(chunk))

    def finish(self) -> None:
        if not self.direct:  # (a direct upload is completed by `commit`, after the checks)
            self.commit()

    def commit(self) -> None:
        self._open = False
        self._file.close()  # (the last part sent, the upload completed: the object whole)

    def discard(self) -> None:
        """The staged objects removed (an unfinished multipart upload aborted)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._file.discard()  # (s3fs: aborts the multipart upload)
                self._file.closed = True  # (nothing left to send when it is collected)
        if self.direct:
            return
        staged = files_under(self.fs, self.stage)
        with contextlib.suppress(Exception):
            if staged:
                self.fs.rm([f"{self.stage}/{key}" for key in staged])


class ObjectVolumes(VolumeFiles):
    """Volumes as objects under `url` (`<url>/volumes/<tenant>/<name>/…`)."""

    in_object_store = True

    def __init__(self, url: str, root: Path, owner_of: Callable[[str], JobUser | None]):
        super().__init__(root, owner_of)
        self.url = url.rstrip("/")
        self.fs, self.base = filesystem(self.url, "the volume store", fresh_listings=True)
        self.base = self.base.rstrip("/")
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.s3 = bool(protocols & S3_PROTOCOLS)

    def top(self, tenant: str, name: str) -> str:
        """The volume's prefix, its names checked first."""
        for what, value in (("tenant", tenant), ("volume name", name)):
            if not _NAME.match(value):
                raise PathRefused(f"invalid {what} {value!r}")
        return f"{self.base}/{VOLUMES}/{tenant}/{name}"

    def key(self, tenant: str, name: str, path: str) -> str:
        """The key of `path` in the volume (checked again: relative, no `..`, no NUL)."""
        return self.folder(tenant, name).key(path)

    def make(self, tenant: str, name: str) -> None:
        self.remove(tenant, name)  # (what an earlier volume of the name left)

    def remove(self, tenant: str, name: str) -> None:
        top = self.top(tenant, name)
        found = files_under(self.fs, top)
        if found:
            self.fs.rm([f"{top}/{key}" for key in found])

    def usage(self, tenant: str, name: str) -> tuple[int, int]:
        return self.folder(tenant, name).usage()

    def remove_path(self, tenant: str, name: str, path: str) -> tuple[int, int]:
        key = self.key(tenant, name, path)
        kind = self.kind_of(tenant, name, path)
        if kind == "file":
            size = int(self.fs.info(key).get("size") or 0)
            self.fs.rm_file(key)
            return 1, size
        if kind != "dir":
            raise NotThere(f"no file or folder {path!r}")
        found = files_under(self.fs, key)
        self.fs.rm([f"{key}/{k}" for k in found])
        return len(found), sum(int(info.get("size") or 0) for info in found.values())

    # ---------------------------------------------------------------- reading

    def folder(self, tenant: str, name: str) -> ObjectFolder:
        return ObjectFolder(self.fs, self.top(tenant, name))

    # ---------------------------------------------------------------- uploads

    def staging(self, tenant: str, room: int, file_at: tuple[str, str] | None = None) -> ObjectUpload:
        stage = f"{self.base}/{STAGING}/{uuid.uuid4().hex}"
        if file_at and self.s3:
            return ObjectUpload(self.fs, stage, room, key=self.key(tenant, *file_at))
        self.sweep_stale()
        return ObjectUpload(self.fs, stage, room)

    def sweep_stale(self, older_than: float = STALE_UPLOAD) -> None:
        """Remove the staging objects left by writers that are gone (not written for `older_than` seconds)."""
        cutoff = time.time() - older_than
        stale = [
            f"{self.base}/{STAGING}/{key}"
            for key, info in files_under(self.fs, f"{self.base}/{STAGING}").items()
            if mtime_of(info) < cutoff
        ]
        with contextlib.suppress(Exception):
            if stale:
                self.fs.rm(stale)

    def place_file(self, tenant: str, name: str, staged: Staged, path: str) -> Written:
        assert isinstance(staged, ObjectUpload)
        if not path:
            raise PathRefused("name the file to write: a path inside the volume")
        check_name_lengths(path)
        if self.kind_of(tenant, name, path) not in (None, "file"):
            raise PathRefused(f"{path!r} is a folder: not replaced by a file")
        for folder in ancestors(path):
            if self.kind_of(tenant, name, folder) == "file":
                raise PathRefused(f"{folder!r} is not a folder (a file)")
        target = self.key(tenant, name, path)
        if not staged.direct:
            self._move(staged.key, target)
        elif staged.key == target:
            staged.commit()
        else:
            raise PathRefused(f"the upload was bound for another file than {path!r}")
        return Written(path, 1, staged.size)

    def place_tree(self, tenant: str, name: str, staged: Staged, path: str, room: int) -> Written:
        assert isinstance(staged, ObjectUpload)
        try:
            with (
                self.fs.open(staged.key, "rb", block_size=PART_SIZE) as f,
                tarfile.open(fileobj=f, mode="r:*") as tar,
            ):
                members = checked_members(tar, room)
                files = [m for m in members if m.isfile()]
                self._check_tree(tenant, name, path, members)
                self._write_members(
                    tar, files, lambda m: self.key(tenant, name, f"{path}/{m.name}" if path else m.name)
                )
        except tarfile.TarError as exc:
            raise PathRefused(f"not a tar stream: {exc}") from None
        return Written(path, len(files), sum(m.size for m in files))

    def _write_members(
        self, tar: tarfile.TarFile, files: list[tarfile.TarInfo], key_of: Callable[[tarfile.TarInfo], str]
    ) -> None:
        """The tar's files written to their keys (`key_of`): the small ones gathered and sent many at a time (as a folder's
        are fetched: `objectfolder.BATCH_BYTES` in memory at most), a large one in parts."""
        batch: dict[str, bytes] = {}
        held = 0
        for m in files:
            check_name_lengths(m.name)
            src = tar.extractfile(m)
            assert src is not None  # (a regular file's)
            with src:
                if m.size > objectfolder.SMALL_FILE:
                    with self.fs.open(key_of(m), "wb", block_size=PART_SIZE) as out:
                        shutil.copyfileobj(src, out, CHUNK)
                    continue
                batch[key_of(m)] = src.read()
            held += m.size
            if held >= objectfolder.BATCH_BYTES or len(batch) >= objectfolder.BATCH_FILES:
                self.fs.pipe(batch)
                batch, held = {}, 0
        if batch:
            self.fs.pipe(batch)

    def _check_tree(self, tenant: str, name: str, path: str, members: list[tarfile.TarInfo]) -> None:
        """PathRefused for a tree whose entries clash, among themselves or with the volume's (a file where the
        other has a folder), before anything of it is written."""
        files = {m.name for m in members if m.isfile()}
        folders = {m.name for m in members if m.isdir()} | {a for f in files for a in ancestors(f)}
        if clash := files & folders:
            raise PathRefused(f"the tree's entries conflict: {min(clash)} is both a file and a folder")
        for folder in [*ancestors(path), path] if path else []:
            if self.kind_of(tenant, name, folder) == "file":
                raise PathRefused(f"{folder!r} is a file in the volume: not a folder to unpack into")
        there = set(files_under(self.fs, self.key(tenant, name, path)))
        there_folders = {a for f in there for a in ancestors(f)}
        for clash_name, kind in ((min(files & there_folders, default=""), "folder"),
                                 (min(folders & there, default=""), "file")):  # fmt: skip
            if clash_name:
                target = f"{path}/{clash_name}" if path else clash_name
                raise PathRefused(f"{target!r} is a {kind} in the volume: not replaced by the upload's")

    def _move(self, source: str, target: str) -> None:
        """An object moved into place: copied (whole, or not at all), then the staged one deleted."""
        self.fs.copy(source, target)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(source)
