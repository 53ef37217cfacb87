"""Trees of files as tar streams, written a chunk at a time (never a file whole in memory), and the paths they may
name: what the API sends and takes for a folder of a volume or a job's outputs, and what the CLI uploads and
unpacks."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import BinaryIO

CHUNK = 1 << 20
MAX_PATH = 4096
END = b"\0" * (2 * tarfile.BLOCKSIZE)
"""What ends a tar stream."""


class PathRefused(ValueError):
    """A path that is not one of a folder's: the message says why."""


def clean_path(text: str) -> str:
    """`text` as a path inside a folder, normalised (`a//b/` -> `a/b`; '' or '.' for the folder itself: '').
    PathRefused for an absolute path, a `..` step, a NUL, or one too long."""
    if "\0" in text:
        raise PathRefused("a path may not hold a NUL byte")
    if len(text) > MAX_PATH:
        raise PathRefused(f"a path may be at most {MAX_PATH} characters")
    if text.startswith("/"):
        raise PathRefused(f"{text!r} is absolute: give a path relative to the folder's top")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"{text!r} leaves the folder ('..' is not allowed)")
    return "/".join(parts)


def folder_header(name: str, mtime: float) -> bytes:
    return _header(name, tarfile.DIRTYPE, 0, mtime)


def file_entry(name: str, f: BinaryIO, size: int, mtime: float) -> Iterator[bytes]:
    """A file's entry: its header, then exactly `size` bytes of `f` (zeros where it ends sooner: an entry's size
    comes before its bytes), then the padding to a block."""
    yield _header(name, tarfile.REGTYPE, size, mtime)
    left = size
    while left:
        chunk = f.read(min(CHUNK, left)) or b"\0" * min(CHUNK, left)
        left -= len(chunk)
        yield chunk
    yield b"\0" * (-size % tarfile.BLOCKSIZE)


def _header(name: str, kind: bytes, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, int(mtime)
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
