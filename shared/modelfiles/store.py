"""The model store: where published ONNX files are kept, immutable.

By default a directory under the data dir (`<data dir>/models`); at scale any fsspec URL
(`GPUYARD_MODEL_STORE=s3://bucket/prefix`, through s3fs: `pip install 'gpuyard[s3]'`).

A version's file is `<store>/<tenant>/<name>/<version>/<sha256>.onnx`: its key names its bytes, so two
publishers racing for one version number never overwrite each other's file (the event store decides which
version exists: the loser's file is removed), and writing the same bytes again changes nothing.

Writes are atomic: on a local directory a temporary file renamed into place (fsynced first); on an object
store a single PUT, or for a staged file of 2 × `PART_SIZE` or more on S3 a multipart upload, completed whole or
aborted (an object appears whole or not at all). Every load checks the SHA-256 (`load`).

An upload is written to a file as it comes (`ModelStore.stage`), hashed on the way, never held in memory whole:
in the store's own directory when it is local (`.uploads/`, so that publishing it is a link, not a copy), else
in a local temporary folder. A staged file (`StagedFile`) is published by `put` as bytes are.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.runtime.objectstore import S3_PROTOCOLS, ObjectStoreError, filesystem, is_local, shown
from gpuyard.shared.runtime.staleuploads import remove_stale
from gpuyard.shared.runtime.uploadfile import UploadFile

CHUNK = 1 << 20
_NAME = re.compile(NAME_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MODELS_DIR = "models"
UPLOADS_DIR = ".uploads"
"""Uploads being written, in a local store's directory."""
PART_SIZE = 8 << 20
"""A multipart upload's part on S3: s3fs sends a staged file of twice this or more in parts, ten at a time (an
upload holds at most ten parts in memory, not a large model whole), a smaller one as one PUT."""


class ModelStoreError(Exception):
    """The model store cannot do what was asked; the message says why (never a credential)."""


class ChecksumMismatch(ModelStoreError):
    """A model file's bytes are not the ones published."""


@dataclass
class StagedFile:
    """A model's bytes in a file, written as they came (`ModelStore.stage`), not yet published: what `put`,
    `sha256_of` and `len` take as they take bytes."""

    path: Path
    sha256: str
    size: int
    signature: Any = None
    """Its signature once checked (`gpuyard.shared.modelfiles.signature.check_file`): not checked again."""

    def __len__(self) -> int:
        return self.size

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class Staging(UploadFile):
    """An upload being written to its file in `folder` (made when missing; stale uploads there removed), hashed as
    it comes: `write` each chunk (blocking: from a thread), then `finish`; `discard` removes the file whatever
    happened."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        remove_stale(folder)
        super().__init__(folder, hashed=True)

    def finish(self) -> StagedFile:
        self.close()
        return StagedFile(self.path, self.sha256, self.size)


def sha256_of(data: bytes | StagedFile) -> str:
    if isinstance(data, StagedFile):
        return data.sha256
    return hashlib.sha256(data).hexdigest()


def _filesystem(url: str):
    """(fsspec filesystem, path in it) of a URL; a plain path is a local directory."""
    try:
        return filesystem(url, "the model store")
    except ObjectStoreError as exc:
        raise ModelStoreError(str(exc)) from None


class ModelStore:
    """Model files under one root: a local directory or an fsspec URL."""

    def __init__(self, url: str):
        if not url:
            raise ModelStoreError("no model store URL")
        self.url = url.rstrip("/")
        self.local = is_local(self.url)
        self._put_options: dict[str, Any] = {}
        """What `put_file` is given beyond the paths (s3fs: its part size)."""
        if self.local:
            self.root = Path(self.url.removeprefix("file://")).expanduser().resolve()
        else:
            self.fs, self.root_path = _filesystem(self.url)
            protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
            if protocols & S3_PROTOCOLS:
                self._put_options["chunksize"] = PART_SIZE

    def __repr__(self) -> str:
        return f"ModelStore({shown(self.url)!r})"

    def key(self, tenant: str, name: str, version: int, sha256: str) -> str:
        for what, value in (("tenant", tenant), ("name", name)):
            if not isinstance(value, str) or not _NAME.match(value):
                raise ModelStoreError(f"invalid model {what} {value!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ModelStoreError(f"invalid model version {version!r}")
        if not _SHA256.match(sha256):
            raise ModelStoreError(f"invalid sha256 {sha256!r}")
        return f"{tenant}/{name}/{version}/{sha256}.onnx"

    def uri(self, tenant: str, name: str, version: int, sha256: str) -> str:
        key = self.key(tenant, name, version, sha256)
        if self.local:
            return str(self.root / key)
        return f"{self.url}/{key}"

    def stage(self) -> Staging:
        """A file to write an upload to, where `put` publishes it without a copy when it can: in the store's
        directory when it is local, else in a local temporary folder. ModelStoreError when none can be made."""
        folder = self.root / UPLOADS_DIR if self.local else Path(tempfile.gettempdir()) / "gpuyard-uploads"
        try:
            return Staging(folder)
        except OSError as exc:
            raise ModelStoreError(f"cannot write an upload in {folder}: {exc.strerror or exc}") from None

    def put(self, tenant: str, name: str, version: int, data: bytes | StagedFile) -> tuple[str, str]:
        """Store `data` (bytes, or a file staged) as that version's file, atomically; (its URI, its sha256).
        The same bytes again are a no-op with the same answer."""
        sha256 = sha256_of(data)
        uri = self.uri(tenant, name, version, sha256)
        if self.local:
            if isinstance(data, StagedFile):
                _put_local_file(Path(uri), data.path)
            else:
                _put_local(Path(uri), data)
            return uri, sha256
        path = f"{self.root_path}/{self.key(tenant, name, version, sha256)}"
        try:
            if isinstance(data, StagedFile):
                self.fs.put_file(str(data.path), path, **self._put_options)  # (multipart: whole or aborted)
            else:
                self.fs.pipe_file(path, data)  # one PUT: the object is whole or absent
        except Exception as exc:
            raise ModelStoreError(f"cannot write {shown(uri)}: {type(exc).__name__}: {exc}") from None
        return uri, sha256

    def delete(self, uri: str) -> None:
        """Remove a version's file (and its folder when it is left empty); nothing when it is gone."""
        if not self.owns(uri):
            raise ModelStoreError(f"{shown(uri)} is not in the model store {self!r}")
        if self.local:
            path = Path(uri)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # only when empty
            return
        fs, path = _filesystem(uri)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise ModelStoreError(f"cannot remove {shown(uri)}: {type(exc).__name__}: {exc}") from None

    def owns(self, uri: str) -> bool:
        if self.local:
            return "://" not in uri and Path(uri).resolve().is_relative_to(self.root)
        return uri.startswith(self.url + "/")


def _put_local(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    _put_local_with(path, write)


def _put_local_file(path: Path, source: Path) -> None:
    """`source` (a staged upload, fsynced) as `path`: a second link to it, or a copy on another filesystem."""

    def link(tmp: Path) -> None:
        try:
            os.link(source, tmp)
        except OSError:  # (another filesystem, or one without links)
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    _put_local_with(path, link)


def _put_local_with(path: Path, write) -> None:
    """The file `write(tmp)` makes, renamed into place as `path`."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write(tmp)
        os.chmod(tmp, 0o400)  # a published version never changes
        os.replace(tmp, path)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # (left by a rename onto a link to the same file, which does nothing)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ModelStoreError(f"cannot write {path}: {exc.strerror or exc}") from None
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load(uri: str, sha256: str) -> bytes:
    """The bytes of a published version's file, checked against its `sha256` (ChecksumMismatch when they
    differ: the file was changed or damaged; ModelStoreError when it cannot be read)."""
    try:
        if is_local(uri):
            data = Path(uri.removeprefix("file://")).read_bytes()
        else:
            fs, path = _filesystem(uri)
            data = fs.cat_file(path)
    except ModelStoreError:
        raise
    except FileNotFoundError:
        raise ModelStoreError(f"model file {shown(uri)} is missing") from None
    except Exception as exc:
        raise ModelStoreError(f"cannot read {shown(uri)}: {type(exc).__name__}: {exc}") from None
    found = sha256_of(data)
    if found != sha256:
        raise ChecksumMismatch(
            f"model file {shown(uri)} has sha256 {found}, not the published {sha256}: it was changed or "
            "damaged, and is not used"
        )
    return data


def load_to(uri: str, sha256: str, folder: Path) -> Path:
    """A local file holding the checked bytes of `uri`, for a runtime that opens a path: the file itself
    when the store is local, else a copy written into `folder` (named by its sha256, so kept between loads)."""
    if is_local(uri):
        load(uri, sha256)  # checks it
        return Path(uri.removeprefix("file://"))
    target = Path(folder) / f"{sha256}.onnx"
    if target.exists():
        with contextlib.suppress(ChecksumMismatch):
            load(str(target), sha256)
            return target
    _put_local(target, load(uri, sha256))
    return target
