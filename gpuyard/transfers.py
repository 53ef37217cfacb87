"""Sending files to the API and fetching them, streamed (never a file whole in memory), with a progress callback:
a file as it is, a folder as a tar stream (`gpuyard.shared.runtime.tarstream`), and a tar stream unpacked where
the CLI is asked to put it, each name checked first (only files and folders, nothing outside the target)."""

from __future__ import annotations

import http.client
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gpuyard import rawhttp
from gpuyard.client import Client, ClientError, detail_of
from gpuyard.shared.runtime.tarstream import CHUNK, END, PathRefused, clean_path, file_entry, folder_header

Progress = Callable[[int], None]
"""Called with each chunk's size as it is sent or received."""


def local_size(path: Path) -> tuple[int, int]:
    """(files, bytes) of a file or of a folder's files (links not followed)."""
    if path.is_file():
        return 1, path.stat().st_size
    files = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(st.st_mode):
                files, size = files + 1, size + st.st_size
    return files, size


def file_chunks(path: Path, progress: Progress) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            progress(len(chunk))
            yield chunk


def tree_chunks(path: Path, progress: Progress) -> Iterator[bytes]:
    """The folder `path` as a tar stream, its entries named from the folder's own name down (files and folders;
    links and other kinds left out)."""
    top = path.name
    yield folder_header(top, path.stat().st_mtime)
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        rel = os.path.relpath(folder, path)
        prefix = top if rel == "." else f"{top}/{rel}"
        for name in dirs:
            yield folder_header(f"{prefix}/{name}", os.lstat(os.path.join(folder, name)).st_mtime)
        for name in sorted(names):
            full = os.path.join(folder, name)
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue
            with open(full, "rb") as f:
                for chunk in file_entry(f"{prefix}/{name}", f, st.st_size, st.st_mtime):
                    progress(len(chunk) if len(chunk) >= 512 else 0)
                    yield chunk
    yield END


def upload(
    client: Client,
    url: str,
    params: dict[str, Any],
    chunks: Iterator[bytes],
    media: str,
    size: int | None = None,
) -> Any:
    """PUT `chunks` to `url` as its body, streamed: `size` bytes when it is known (a file: the server can refuse
    it before it comes, and neither side frames chunks), else chunked (a tar stream). The answer, as
    `Client.request` gives it. Not retried: a stream is read once."""
    headers = {"Content-Type": media}
    if size is not None:
        headers["Content-Length"] = str(size)
    try:
        response = client.http.put(url, params=params, content=chunks, headers=headers, timeout=None)
    except httpx.ConnectError:
        raise ClientError(client.unreachable()) from None
    except httpx.HTTPError as exc:
        raise ClientError(f"the upload to {client.server} failed: {exc}") from None
    return client.answer_of(response)


def upload_file(
    client: Client, url: str, params: dict[str, Any], path: Path, media: str, progress: Progress
) -> Any:
    """PUT the file `path` to `url` as its body, of its length (the server can refuse it before it comes):
    through the socket where nothing stands between (`rawhttp`), else through httpx. The answer, as
    `Client.request` gives it."""
    if not rawhttp.direct(client.http):
        return upload(client, url, params, file_chunks(path, progress), media, path.stat().st_size)
    try:
        response = rawhttp.put_file(client.http, url, params, path, media, progress)
    except ConnectionRefusedError:
        raise ClientError(client.unreachable()) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ClientError(f"the upload to {client.server} failed: {exc}") from None
    return client.answer_of(response)


def download(client: Client, url: str, params: dict[str, Any], target: Path, progress: Progress) -> str:
    """GET `url` and write what it answers: a file at `target`, or a tar stream (a folder) unpacked into the
    folder `target`. Returns what it was: `file` or `dir`. Nothing is left at `target` when it fails."""
    try:
        with _fetch(client, url, params) as (response, pieces):
            if response.status_code >= 400:
                answer = httpx.Response(response.status_code, content=b"".join(bytes(p) for p in pieces))
                raise ClientError(f"{detail_of(answer)} (HTTP {response.status_code})")
            chunks = _counted(pieces, progress)
            if response.headers.get("content-type", "").startswith("application/x-tar"):
                _unpack(chunks, target)
                return "dir"
            if rawhttp.spliceable(response):
                _write(target, lambda fd: rawhttp.save(response, fd, progress))
            else:
                _write(target, lambda fd: _copy(chunks, fd))
            return "file"
    except (httpx.ConnectError, ConnectionRefusedError):
        raise ClientError(client.unreachable()) from None
    except (httpx.HTTPError, OSError, http.client.HTTPException) as exc:
        raise ClientError(f"the download from {client.server} failed: {exc}") from None


@contextmanager
def _fetch(client: Client, url: str, params: dict[str, Any]) -> Iterator[tuple[httpx.Response, Iterator]]:
    """The answer to a GET of `url` and its body's pieces as they come (each written or copied before the next
    is asked for): through the socket where nothing stands between (`rawhttp`), else through httpx, asking
    for the bytes as they are (no content coding) and taking them as they come (no copies into chunks)."""
    if rawhttp.direct(client.http):
        with rawhttp.get(client.http, url, params) as response:
            yield response, rawhttp.chunks(response)
        return
    headers = {"Accept-Encoding": "identity"}
    with client.http.stream("GET", url, params=params, headers=headers, timeout=None) as response:
        yield response, response.iter_raw()


def _counted(chunks: Iterator[bytes], progress: Progress) -> Iterator[bytes]:
    for chunk in chunks:
        progress(len(chunk))
        yield chunk


def _copy(chunks: Iterator[bytes], fd: int) -> None:
    for chunk in chunks:
        rawhttp.write_all(fd, chunk)


def _write(target: Path, fill: Callable[[int], None]) -> None:
    """`fill` writes the file's bytes to the descriptor it is given: a file beside `target`, renamed to it
    once whole (removed if anything fails)."""
    partial = target.with_name(f".{target.name}.part")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            fill(fd)
        finally:
            os.close(fd)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


class _ChunkReader(io.RawIOBase):
    """Chunks read as a file (for tarfile's stream mode, through a buffer): each byte copied once."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _unpack(chunks: Iterator[bytes], target: Path) -> None:
    """Unpack a tar stream whose entries sit under one top folder into `target` (which must not exist): the top
    folder's content goes in `target`. Only files and folders, every name clean."""
    if target.exists():
        raise ClientError(f"{target} exists: choose another place with -o")
    partial = target.with_name(f".{target.name}.part")
    try:
        stream = io.BufferedReader(_ChunkReader(chunks), CHUNK)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                _extract(tar, member, partial)
        partial.mkdir(exist_ok=True)
        os.replace(partial, target)
    except (PathRefused, tarfile.TarError) as exc:
        raise ClientError(f"the server sent a tree that cannot be unpacked: {exc}") from None
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path) -> None:
    name = clean_path(member.name).partition("/")[2]  # (below the top folder)
    where = into / name if name else into
    if member.isdir():
        where.mkdir(parents=True, exist_ok=True)
    elif member.isfile():
        where.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(member)
        assert src is not None
        with src, open(where, "xb") as f:
            while chunk := src.read(CHUNK):
                f.write(chunk)
    else:
        raise PathRefused(f"{member.name!r} is neither a file nor a folder")
