"""A volume in an object store copied to the node before a replica starts (`volumecache.py`), against moto's S3
server on loopback (tests/s3server.py): the first copy fetches every object, the next only a changed or new one
and removes the files of objects gone; the copy is mounted read-only from its folder (bound, or a link with the
note), its notes say what it copied, and a store that cannot be read fails the copy with the reason."""

from __future__ import annotations

import asyncio
import os

import pytest

from gpuyard.services.executor.volumecache import VOLUME_CACHE, CacheError, VolumeCache
from gpuyard.services.executor.volumemounts import make_mount_points, plan
from gpuyard.shared.contracts.jobspec import VolumeMount
from tests.s3server import S3Server

PREFIX = "volume store é"
TENANT, NAME = "vision", "imagenet"


def put(server: S3Server, bucket: str, path: str, data: bytes) -> None:
    key = f"{PREFIX}/volumes/{TENANT}/{NAME}/{path}"
    server.client().put_object(Bucket=bucket, Key=key, Body=data)


def test_the_first_copy_fetches_all_the_next_only_what_changed(s3_server, bucket, tmp_path):
    put(s3_server, bucket, "train/a b.bin", b"a" * 1000)
    put(s3_server, bucket, "train/ü.bin", b"u" * 10)
    put(s3_server, bucket, "labels.csv", b"x,y\n")
    cache = VolumeCache(f"s3://{bucket}/{PREFIX}", tmp_path / "storage", lambda tenant: None)
    first = cache.sync(TENANT, NAME)
    assert (first.fetched, first.bytes, first.files) == (3, 1014, 3)
    folder = tmp_path / "storage" / VOLUME_CACHE / TENANT / NAME
    assert (folder / "train" / "a b.bin").read_bytes() == b"a" * 1000
    assert os.stat(folder).st_mode & 0o777 == 0o750

    put(s3_server, bucket, "labels.csv", b"x,y\n1,2\n")  # changed
    put(s3_server, bucket, "new.txt", b"n")  # new
    s3_server.client().delete_object(Bucket=bucket, Key=f"{PREFIX}/volumes/{TENANT}/{NAME}/train/ü.bin")
    second = cache.sync(TENANT, NAME)
    assert (second.fetched, second.bytes, second.files) == (2, 9, 3)
    assert (folder / "labels.csv").read_bytes() == b"x,y\n1,2\n"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "labels.csv", "new.txt", "train/a b.bin",
    ]  # fmt: skip
    assert cache.sync(TENANT, NAME).fetched == 0  # nothing changed since


def test_the_copy_is_mounted_read_only_with_a_note_of_what_it_copied(s3_server, bucket, tmp_path):
    put(s3_server, bucket, "labels.csv", b"x,y\n")
    cache = VolumeCache(f"s3://{bucket}/{PREFIX}", tmp_path / "storage", lambda tenant: None)
    mounts = [VolumeMount(name=NAME, path="data", read_only=True)]
    cached = asyncio.run(cache.fetch(mounts, TENANT))
    copy = str(cache.folder(TENANT, NAME))
    assert cached.sources == {NAME: copy}
    assert cached.notes[0].startswith(f"volume {NAME}: copied 1 file (4 B) from the object store in ")
    cwd = tmp_path / "work"
    cwd.mkdir()
    bound = plan(
        mounts, root=str(tmp_path / "storage"), tenant=TENANT, cwd=str(cwd), namespace=True, cached=cached
    )
    assert bound.binds == ((copy, f"{cwd}/data"),) and bound.read_only == (f"{cwd}/data",)
    assert bound.notes == cached.notes
    linked = plan(
        mounts, root=str(tmp_path / "storage"), tenant=TENANT, cwd=str(cwd), namespace=False, cached=cached
    )
    make_mount_points(linked, str(cwd), None)
    assert os.readlink(cwd / "data") == copy and (cwd / "data" / "labels.csv").read_bytes() == b"x,y\n"
    assert "read-only not enforced" in linked.notes[-1]


def test_a_store_that_cannot_be_read_fails_the_copy_with_the_reason(bucket, tmp_path):
    cache = VolumeCache("s3://no-such-bucket-gpuyard/volumes", tmp_path / "storage", lambda tenant: None)
    mounts = [VolumeMount(name=NAME, path="data", read_only=True)]
    with pytest.raises(CacheError, match=f"cannot copy volume '{NAME}' from the object store: "):
        asyncio.run(cache.fetch(mounts, TENANT))
