"""Jobs' kept outputs in an object store (`GPUYARD_OUTPUT_STORE=s3://bucket/prefix`, or any fsspec URL): a job's
outputs are the objects under `<prefix>/outputs/<tenant>/<job id>/`, as its output folder holds them in the
storage root (`paths.job_storage`).

The executor that ran an attempt copies the job's output folder there once the attempt has ended (`publish`:
the files new or changed since the last copy, read through `SafeFolder`, never through a link nor a file that is
not the job's user's), so that what a job kept outlives its node; the API lists and serves them from there
(`folder`: an `ObjectFolder`), and the submit service's retention removes them with the job (`remove`)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from typing import Any

from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.runtime import objectfolder
from gpuyard.shared.runtime.objectfolder import ObjectFolder
from gpuyard.shared.runtime.objectstore import files_under, filesystem, mtime_of
from gpuyard.shared.runtime.paths import OUTPUTS
from gpuyard.shared.runtime.safefolder import NotThere, SafeFolder
from gpuyard.shared.runtime.tarstream import CHUNK, PathRefused

_NAME = re.compile(NAME_PATTERN)
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


class OutputStore:
    """The outputs of jobs under `url`."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, base = filesystem(self.url, "the output store", fresh_listings=True)
        self.base = f"{base.rstrip('/')}/{OUTPUTS}"

    def prefix(self, tenant: str, job_id: str) -> str:
        """The job's prefix, its tenant and id checked first (nothing outside it is ever named)."""
        if not _NAME.match(tenant):
            raise PathRefused(f"invalid tenant {tenant!r}")
        if not _JOB_ID.match(job_id):
            raise PathRefused(f"invalid job id {job_id!r}")
        return f"{self.base}/{tenant}/{job_id}"

    def folder(self, tenant: str, job_id: str) -> ObjectFolder:
        return ObjectFolder(self.fs, self.prefix(tenant, job_id))

    def publish(self, tenant: str, job_id: str, source: SafeFolder) -> tuple[int, int]:
        """The files of `source` (a job's output folder) that the store lacks or holds older or of another size,
        copied there: (files, bytes) copied. Small files go many at a time (as `ObjectFolder` fetches them), a
        large one in parts. Nothing when the folder is not there."""
        prefix = self.prefix(tenant, job_id)
        held = files_under(self.fs, prefix)
        try:
            walked = list(source.walk())
        except NotThere:
            return 0, 0
        batch: dict[str, bytes] = {}
        copied = size = batched = 0
        for path, st in walked:
            there = held.get(path)
            if not stat.S_ISREG(st.st_mode) or (
                there and int(there.get("size") or 0) == st.st_size and mtime_of(there) > st.st_mtime
            ):  # (the store's times are whole seconds: a file of the second of its last copy goes again)
                continue
            try:
                fd, opened = source.open_file(path)
            except NotThere:
                continue  # (gone, a link, or not the job's user's)
            with os.fdopen(fd, "rb") as f:
                if opened.st_size > objectfolder.SMALL_FILE:
                    self._put(f, f"{prefix}/{path}")
                else:
                    batch[f"{prefix}/{path}"] = f.read()
                    batched += opened.st_size
            copied, size = copied + 1, size + opened.st_size
            if batched >= objectfolder.BATCH_BYTES or len(batch) >= objectfolder.BATCH_FILES:
                self.fs.pipe(batch)
                batch, batched = {}, 0
        if batch:
            self.fs.pipe(batch)
        return copied, size

    def _put(self, f: Any, key: str) -> None:
        """A large file as the object `key`, in parts (one in memory at a time)."""
        with self.fs.open(key, "wb", block_size=objectfolder.PART_SIZE) as out:
            while chunk := f.read(CHUNK):
                out.write(chunk)

    def remove(self, tenant: str, job_id: str) -> int:
        """The job's objects removed: how many."""
        prefix = self.prefix(tenant, job_id)
        found = files_under(self.fs, prefix)
        if found:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm([f"{prefix}/{key}" for key in found])
        return len(found)

    def remove_job(self, job_id: str) -> int:
        """The objects of the job `job_id` of whichever tenant removed (for the retention, which knows the id
        only): how many."""
        try:
            tenants = [
                info["name"].rstrip("/").rpartition("/")[2] for info in self.fs.ls(self.base, detail=True)
            ]
        except FileNotFoundError:
            return 0
        return sum(self.remove(tenant, job_id) for tenant in tenants if _NAME.match(tenant))
