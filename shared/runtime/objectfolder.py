"""A folder of an object store, read as `SafeFolder` reads one on disk: the objects under a prefix are its files,
the prefixes their keys imply its folders (an object store keeps no empty folder). What a volume in an object
store (`services/submit/volumeobjects.py`) and a job's outputs kept in one are read through: listed a level at
a time, a file streamed in parts, a folder as a tar stream whose small files are fetched many at a time.

Every key is the prefix and a path checked by `clean_path` (relative, no `..`, no NUL): nothing outside the
prefix is ever named."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

from gpuyard.shared.runtime.objectstore import files_under, mtime_of
from gpuyard.shared.runtime.safefolder import MAX_LISTED, Entry, NotThere
from gpuyard.shared.runtime.tarstream import CHUNK, END, PathRefused, clean_path, file_entry, folder_header

PART_SIZE = 32 << 20
"""What a file is read in (a GET each; one part in memory per download), a chunk at a time: each GET costs a
round trip, so fewer and larger ones (8 MB parts took 3 times as long as 32 MB ones for 500 MB from a loopback
S3 server, docs/benchmarks.md)."""
SMALL_FILE = 8 << 20
"""A folder's files up to this size are fetched together for its tar stream, up to `BATCH_BYTES` or
`BATCH_FILES` at a time; a larger one in parts."""
BATCH_BYTES = 64 << 20
BATCH_FILES = 1000


def ancestors(path: str) -> list[str]:
    """The folders above `path`: `a/b/c` -> [`a`, `a/b`]."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class ObjectFolder:
    """The objects under `prefix` of the fsspec filesystem `fs`, as a folder."""

    def __init__(self, fs: Any, prefix: str):
        self.fs = fs
        self.prefix = prefix.rstrip("/")

    def key(self, path: str) -> str:
        """The key of `path` (checked again: relative, no `..`, no NUL)."""
        clean = clean_path(path)
        return f"{self.prefix}/{clean}" if clean else self.prefix

    def files(self, path: str = "") -> dict[str, dict[str, Any]]:
        """Every file under `path`: its path below `path` -> what fsspec says of it."""
        return files_under(self.fs, self.key(path))

    def usage(self) -> tuple[int, int]:
        """(files, bytes) of the whole folder."""
        found = self.files()
        return len(found), sum(int(info.get("size") or 0) for info in found.values())

    def kind_of(self, path: str) -> str | None:
        """`file`, `dir` (the top always is one) or None."""
        if not clean_path(path):
            return "dir"
        try:
            info = self.fs.info(self.key(path))
        except FileNotFoundError:
            return None
        return "dir" if info.get("type") == "directory" else "file"

    def listing(self, path: str) -> tuple[list[Entry], bool]:
        """The entries of the folder at `path`, one level, by name (at most MAX_LISTED; True: more)."""
        kind = self.kind_of(path)
        if kind is None:
            raise NotThere(f"no folder {path!r}")
        if kind != "dir":
            raise PathRefused(f"{path!r} is not a folder")
        prefix = self.key(path)
        try:
            found = self.fs.ls(prefix, detail=True)
        except FileNotFoundError:
            found = []
        entries = []
        for info in found:
            leaf = info["name"].rstrip("/").rpartition("/")[2]
            if not leaf or info["name"].rstrip("/") == prefix:
                continue
            kind = "dir" if info.get("type") == "directory" else "file"
            full = f"{path}/{leaf}" if path else leaf
            entries.append(Entry(full, kind, int(info.get("size") or 0), mtime_of(info)))
        entries.sort(key=lambda e: e.path)
        return entries[:MAX_LISTED], len(entries) > MAX_LISTED

    def read_file(self, path: str) -> tuple[int, Iterator[bytes]]:
        """The file at `path`: its size and its bytes, read as they are sent (NotThere: no such file)."""
        if not clean_path(path) or self.kind_of(path) != "file":
            raise NotThere(f"no file {path!r}")
        key = self.key(path)
        return int(self.fs.info(key).get("size") or 0), self._chunks(key)

    def _chunks(self, key: str) -> Iterator[bytes]:
        with self.fs.open(key, "rb", block_size=PART_SIZE) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def tar_chunks(self, path: str, top: str = "") -> Iterator[bytes]:
        """The folder at `path` as an uncompressed tar stream, its entries named from the folder's own name down
        (`top` names the whole folder's). A file gone while it is sent comes as zeros of its listed size."""
        root = path.rpartition("/")[2] or top or "files"
        prefix = self.key(path)
        made: set[str] = set()
        listed = sorted(files_under(self.fs, prefix).items())
        fetched = self._small_files(prefix, listed)
        for rel, info in listed:
            mtime = mtime_of(info)
            for folder in ancestors(rel):
                if folder not in made:
                    made.add(folder)
                    yield folder_header(f"{root}/{folder}", mtime)
            size = int(info.get("size") or 0)
            data = next(fetched) if size <= SMALL_FILE else None
            with (
                io.BytesIO(data)
                if data is not None
                else self.fs.open(f"{prefix}/{rel}", "rb", block_size=PART_SIZE) as f
            ):
                yield from file_entry(f"{root}/{rel}", f, size, mtime)
        yield END

    def _small_files(self, prefix: str, listed: list[tuple[str, dict]]) -> Iterator[bytes]:
        """The bytes of each small file of `listed` in its order (empty where it went meanwhile), fetched many
        at a time (`BATCH_BYTES` or `BATCH_FILES` at most held)."""
        sizes = {rel: int(info.get("size") or 0) for rel, info in listed}
        small = [rel for rel, _ in listed if sizes[rel] <= SMALL_FILE]
        start = 0
        while start < len(small):
            end, held = start, 0
            while end < len(small) and end - start < BATCH_FILES and held < BATCH_BYTES:
                held += sizes[small[end]]
                end += 1
            keys = [f"{prefix}/{rel}" for rel in small[start:end]]
            got = self.fs.cat(keys, on_error="omit")
            for key in keys:
                yield got.get(key, b"")
            start = end
