"""Reading and writing under a folder that jobs write to (a volume, a job's outputs) without ever leaving it.

Jobs own what is in those folders and may put anything there: a symbolic link to /etc, a hard link to a file of
the platform's, a name with a NUL. So a path asked for is checked as text first (`clean_path`: relative, no
`..`, no NUL, no empty step), then walked one step at a time from the folder's own descriptor, each step opened
with O_NOFOLLOW: a symbolic link anywhere on the way is refused, never followed. Where jobs run as other users
than the platform's, what is read must belong to the user of the folder (`owner`): a hard link to a file of
someone else's is refused too (the API reads as root)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from gpuyard.shared.runtime.tarstream import CHUNK, END, PathRefused, file_entry, folder_header

MAX_LISTED = 10_000
"""The most entries one listing answers (it says when there were more)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotThere(LookupError):
    """Nothing at that path, or something that may not be read (HTTP 404)."""


def chunks_of(fd: int) -> Iterator[bytes]:
    """An open file's bytes, a chunk at a time, closed at the end (a sync iterator: Starlette runs it in a
    thread)."""
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


@dataclass(frozen=True)
class Entry:
    path: str
    """Relative to the folder's top."""
    kind: str
    """`file` or `dir` (anything else, a link included, is listed as `other` and never read)."""
    size: int
    modified: float


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    return "dir" if stat.S_ISDIR(mode) else "other"


class ReadableFolder(Protocol):
    """A folder the API reads files from and sends as they are read: a `SafeFolder` on disk, or an
    `ObjectFolder` (`objectfolder.py`) of an object store. Paths are clean (`clean_path`)."""

    def kind_of(self, path: str) -> str | None:
        """`file`, `dir`, `other`, or None for nothing at `path`."""
        ...

    def listing(self, path: str) -> tuple[list[Entry], bool]:
        """A folder's entries, one level, by name, and whether there were more."""
        ...

    def read_file(self, path: str) -> tuple[int, Iterator[bytes]]:
        """A file's size and its bytes (NotThere for none)."""
        ...

    def tar_chunks(self, path: str, top: str = "") -> Iterator[bytes]:
        """A folder as an uncompressed tar stream (entries under its own name; the top's under `top`)."""
        ...


class SafeFolder:
    """A folder read and written without leaving it (see the module's text). `owner`: the uid every file read
    must belong to (None: any, where jobs run as the platform's own user)."""

    def __init__(self, top: str | os.PathLike[str], owner: int | None = None):
        self.top = os.fspath(top)
        self.owner = owner

    # ---------------------------------------------------------------- walking

    def open_dir(self, path: str, *, create: tuple[int, int] | None = None) -> int:
        """A descriptor of the folder at `path` (clean), each step opened without following a link. `create`:
        (uid, gid) to make the missing steps with (0755), else NotThere for one missing."""
        try:
            fd = os.open(self.top, _DIR_FLAGS)
        except FileNotFoundError:
            raise NotThere("the folder does not exist") from None
        for part in path.split("/") if path else ():
            try:
                nxt = self._step(fd, part, create)
            finally:
                os.close(fd)
            fd = nxt
        return fd

    def _step(self, fd: int, part: str, create: tuple[int, int] | None) -> int:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if create is None:
                raise NotThere(f"no folder {part!r}") from None
        except OSError as exc:  # ELOOP: a link; ENOTDIR: a file; ENAMETOOLONG: a name no file has
            if exc.errno == errno.ENAMETOOLONG:
                raise NotThere("no file or folder has a name that long") from None
            raise PathRefused(
                f"{part!r} is not a folder (a file, or a link, which is never followed)"
            ) from exc
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o755, dir_fd=fd)
            os.chown(part, *create, dir_fd=fd, follow_symlinks=False)
        return os.open(part, _DIR_FLAGS, dir_fd=fd)

    def _readable(self, st: os.stat_result) -> bool:
        return self.owner is None or st.st_uid == self.owner

    def open_file(self, path: str) -> tuple[int, os.stat_result]:
        """A descriptor of the regular file at `path` (clean, not ''), read-only, and its stat. NotThere for none,
        for a link, or one that may not be read."""
        parent, _, name = path.rpartition("/")
        dfd = self.open_dir(parent)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            raise NotThere(f"no file {path!r}") from None
        except OSError:
            raise NotThere(f"{path!r} is a link, which is never followed") from None
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not self._readable(st):
            os.close(fd)
            raise NotThere(f"{path!r} is not a file that can be read")
        return fd, st

    def read_file(self, path: str) -> tuple[int, Iterator[bytes]]:
        """The file at `path` (`open_file`'s checks): its size and its bytes, read as they are sent."""
        fd, st = self.open_file(path)
        return st.st_size, chunks_of(fd)

    def kind_of(self, path: str) -> str | None:
        """`file`, `dir` or `other` for what is at `path` (clean), without following a link; None for nothing."""
        if not path:
            return "dir" if os.path.isdir(self.top) else None
        parent, _, name = path.rpartition("/")
        try:
            dfd = self.open_dir(parent)
        except (NotThere, PathRefused):
            return None
        try:
            return _kind(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                return None
            raise
        finally:
            os.close(dfd)

    # ---------------------------------------------------------------- reading

    def listing(self, path: str, limit: int = MAX_LISTED) -> tuple[list[Entry], bool]:
        """The entries of the folder at `path` (one level, sorted by name), and whether there were more."""
        fd = self.open_dir(path)
        try:
            names = sorted(os.listdir(fd))
            entries = []
            for name in names[:limit]:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    full = f"{path}/{name}" if path else name
                    entries.append(Entry(full, _kind(st.st_mode), st.st_size, st.st_mtime))
            return entries, len(names) > limit
        finally:
            os.close(fd)

    def walk(self, path: str = "") -> Iterator[tuple[str, os.stat_result]]:
        """Every file and folder under `path` (clean), depth first, never through a link: (its path, its stat)."""
        fd = self.open_dir(path)
        try:
            yield from self._walk(fd, path)
        finally:
            os.close(fd)

    def _walk(self, fd: int, path: str) -> Iterator[tuple[str, os.stat_result]]:
        for name in sorted(os.listdir(fd)):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            full = f"{path}/{name}" if path else name
            yield full, st
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    yield from self._walk(sub, full)
                finally:
                    os.close(sub)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) of everything in the folder: its regular files' sizes."""
        return self.usage_of("")

    def usage_of(self, path: str) -> tuple[int, int]:
        """(files, bytes) of everything under `path` (clean): its regular files' sizes."""
        files = size = 0
        with contextlib.suppress(NotThere):
            for _, st in self.walk(path):
                if stat.S_ISREG(st.st_mode):
                    files += 1
                    size += st.st_size
        return files, size

    def tar_chunks(self, path: str, top: str = "") -> Iterator[bytes]:
        """The folder at `path` (clean) as an uncompressed tar stream, a chunk at a time, its entries named from
        the folder's own name down (`top` names the whole folder's); links and files that may not be read are left
        out. A file that grows while it is sent is cut at the size it had, one that shrinks padded with zeros."""
        root = path.rpartition("/")[2] or top or "files"
        for full, st in self.walk(path):
            name = f"{root}/{full[len(path) :].lstrip('/')}"
            if stat.S_ISDIR(st.st_mode):
                yield folder_header(name, st.st_mtime)
            elif stat.S_ISREG(st.st_mode) and self._readable(st):
                try:
                    fd, st = self.open_file(full)
                except NotThere:
                    continue
                with os.fdopen(fd, "rb") as f:
                    yield from file_entry(name, f, st.st_size, st.st_mtime)
        yield END
