"""Where a volume's bytes live, behind one interface (`VolumeFiles`): a folder of the storage root
(`volumefolders.py`, the default) or an object store (`volumeobjects.py`, `GPUYARD_VOLUME_STORE`); which one a
platform uses: `volumestores.py`. The API's routes (`routes_volumes.py`) see only this interface.

Whatever the store, paths inside a volume are clean (`clean_path`: relative, no `..`, no NUL) before anything is
built from them; an upload is staged whole (`staging`, counted against the room left: `OverQuota` past it)
before it is placed in the volume (`place_file`, `place_tree`), and a staged upload discarded leaves nothing."""

from __future__ import annotations

import tarfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.safefolder import Entry, ReadableFolder
from gpuyard.shared.runtime.tarstream import PathRefused, clean_path
from gpuyard.shared.runtime.uploadfile import OverQuota

MAX_TREE_ENTRIES = 1_000_000
NAME_MAX = 255
"""The longest name of a file or folder (bytes), as the file systems take it."""


@dataclass(frozen=True)
class Written:
    path: str
    files: int
    bytes: int


class Staged(Protocol):
    """An upload being staged: `write` each chunk (blocking: from a thread), `finish` once all came, `discard`
    whatever happened (it removes what was staged)."""

    size: int

    def write(self, chunk: bytes | bytearray) -> None: ...

    def finish(self) -> None: ...

    def discard(self) -> None: ...


class VolumeFiles(ABC):
    """The files of tenants' volumes. `root`: the storage root; `owner_of(tenant)`: the user its jobs run as
    (None: the platform's). Every method blocks: call it from a thread."""

    in_object_store = False
    """Whether jobs get a copy (an object store) rather than the volume's own folder: mounted read-only only."""

    def __init__(self, root: Path, owner_of: Callable[[str], JobUser | None]):
        self.root = root
        self.owner_of = owner_of

    @abstractmethod
    def make(self, tenant: str, name: str) -> None:
        """The volume, empty (what an earlier volume of the name left is removed)."""

    @abstractmethod
    def remove(self, tenant: str, name: str) -> None:
        """The volume and everything in it."""

    @abstractmethod
    def usage(self, tenant: str, name: str) -> tuple[int, int]:
        """(files, bytes) the volume holds now."""

    @abstractmethod
    def remove_path(self, tenant: str, name: str, path: str) -> tuple[int, int]:
        """Remove the file or folder at `path` (clean, not ''): (files, bytes) it held. NotThere for nothing."""

    @abstractmethod
    def folder(self, tenant: str, name: str) -> ReadableFolder:
        """The volume's files as a folder to read (a listing, a file, a tar stream of a folder)."""

    def listing(self, tenant: str, name: str, path: str) -> tuple[list[Entry], bool]:
        """The entries of the folder at `path` (one level, by name) and whether there were more. NotThere for no
        folder there, PathRefused for a file."""
        return self.folder(tenant, name).listing(path)

    def kind_of(self, tenant: str, name: str, path: str) -> str | None:
        """`file`, `dir` or `other` for what is at `path` (clean; '' the volume's top); None for nothing."""
        return self.folder(tenant, name).kind_of(path)

    @abstractmethod
    def staging(self, tenant: str, room: int, file_at: tuple[str, str] | None = None) -> Staged:
        """Where an upload of at most `room` bytes is written as it comes (stale ones swept first). `file_at`:
        the (volume, path) a file's upload is bound for, where a store can write it there directly and still
        show it only whole (an S3 multipart upload); `place_file` is then called with the same."""

    @abstractmethod
    def place_file(self, tenant: str, name: str, staged: Staged, path: str) -> Written:
        """The staged upload as the file at `path` (clean, not ''; its folders made; a file there replaced).
        PathRefused for a folder in the way, or a file on the way."""

    @abstractmethod
    def place_tree(self, tenant: str, name: str, staged: Staged, path: str, room: int) -> Written:
        """The staged tar stream unpacked under the folder `path` (clean; '' the top): PathRefused for an entry
        that is not a file or folder, or whose name is not a clean path, or that clashes with what is there;
        OverQuota for files past `room`. Nothing is placed then."""


def check_name_lengths(path: str) -> None:
    if any(len(step.encode("utf-8", "surrogateescape")) > NAME_MAX for step in path.split("/")):
        raise PathRefused(f"a file or folder name may be at most {NAME_MAX} bytes")


def checked_members(tar: tarfile.TarFile, room: int) -> list[tarfile.TarInfo]:
    """Every entry of `tar`, checked before anything is placed: only files and folders, each name a clean path
    (normalised in place), none twice, the files within `room`."""
    members: list[tarfile.TarInfo] = []
    size, names = 0, set()
    for m in tar:
        if len(members) >= MAX_TREE_ENTRIES:
            raise PathRefused(f"a tree may hold at most {MAX_TREE_ENTRIES:,} entries")
        if not (m.isfile() or m.isdir()):
            raise PathRefused(f"{m.name!r} is neither a file nor a folder (links are not taken)")
        m.name = clean_path(m.name)
        if not m.name:
            continue
        if m.name in names:
            raise PathRefused(f"{m.name!r} is in the tree twice")
        names.add(m.name)
        size += m.size if m.isfile() else 0
        if size > room:
            raise OverQuota(f"the tree's files do not fit: the volume has {format_size(room)} left")
        members.append(m)
    return members
