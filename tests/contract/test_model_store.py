"""The model store's contract (`gpuyard.shared.modelfiles.store`), one suite run on each kind of store:

- `local`: a directory (the default store, `<data dir>/models`);
- `s3`: an S3 bucket through s3fs, served by moto's S3 server on loopback (tests/s3server.py), the store
  pointed at it as a user points it at MinIO: `GPUYARD_MODEL_STORE=s3://bucket/prefix` and the standard AWS
  variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`).

Each store's root has a space and a non-ASCII letter in its path. What every kind does: a put of bytes or of a
staged upload (one beyond two multipart parts: on S3 it goes up in parts) reads back the same bytes, at a key
named by them, with its size; the same bytes again change nothing; a file that is not there, or whose bytes
changed, is refused by every load with the reason; a delete removes only its own file, and again is no error;
names the store refuses write nothing; a store that cannot be written says why; and a put that fails midway
(the disk refusing the final rename; the network to S3 lost during the upload) leaves nothing visible.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuyard.shared.modelfiles.store import (
    PART_SIZE,
    UPLOADS_DIR,
    ChecksumMismatch,
    ModelStore,
    ModelStoreError,
    StagedFile,
    load,
    load_to,
    sha256_of,
)
from gpuyard.shared.runtime.installhint import install_command
from tests.s3server import SECRET, CutLink, S3Server, forget_s3_clients, pointed_at

LOCAL, S3 = "local", "s3"
ROOT = "model store é"
"""The store's own folder (a directory; the key prefix in the bucket): a space and a non-ASCII letter."""
TENANT, NAME = "vision", "resnet"
SMALL = os.urandom(64 * 1024 + 7)
LARGE_SIZE = 2 * PART_SIZE + (1 << 20)
"""Beyond two parts: on S3, parts of PART_SIZE, PART_SIZE and 1 MiB (the last part may be under 5 MiB)."""


@dataclass
class LocalBackend:
    root: Path
    part_size: int | None = None

    @property
    def url(self) -> str:
        return str(self.root)

    def objects(self) -> dict[str, int]:
        """Every file under the store (temporary ones too), but its uploads folder: key -> size."""
        if not self.root.exists():
            return {}
        files = (p for p in self.root.rglob("*") if p.is_file() and UPLOADS_DIR not in p.parts)
        return {p.relative_to(self.root).as_posix(): p.stat().st_size for p in files}

    def parts(self, key: str) -> int:
        return 1  # a file, renamed into place whole

    def damage(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.chmod(0o600)
        path.write_bytes(data)

    def foreign_uris(self, key: str) -> list[str]:
        return [str(self.root.parent / "elsewhere" / key), f"s3://bucket/{key}"]

    def unwritable_url(self) -> str:
        blocker = self.root.parent / "a-file"
        blocker.write_bytes(b"")
        return str(blocker / "models")

    @contextlib.contextmanager
    def failing_midway(self, allowance: int) -> Iterator[None]:
        """Every rename fails (the disk refuses it, EIO) once the bytes were written."""

        def refused(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EIO, "Input/output error")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "replace", refused)
            yield


@dataclass
class S3Backend:
    server: S3Server
    bucket: str
    prefix: str = ROOT
    part_size: int | None = PART_SIZE
    cut: list[CutLink] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def objects(self) -> dict[str, int]:
        return self.server.objects(self.bucket, self.prefix)

    def parts(self, key: str) -> int:
        return self.server.parts(self.bucket, f"{self.prefix}/{key}")

    def damage(self, key: str, data: bytes) -> None:
        self.server.client().put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)

    def foreign_uris(self, key: str) -> list[str]:
        return [f"s3://{self.bucket}/{self.prefix}-other/{key}", f"s3://other-bucket/{self.prefix}/{key}"]

    def unwritable_url(self) -> str:
        return f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/models"

    @contextlib.contextmanager
    def failing_midway(self, allowance: int) -> Iterator[None]:
        """The store reaches S3 through a link that carries `allowance` bytes of requests, then is lost for
        good (botocore tries each request once: s3fs's own retries still run)."""
        with CutLink(self.server.address, allowance) as link, pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL", link.endpoint)
            patch.setenv("AWS_MAX_ATTEMPTS", "1")
            forget_s3_clients()
            self.cut.append(link)
            try:
                yield
            finally:
                forget_s3_clients()


Backend = LocalBackend | S3Backend


@pytest.fixture(params=[LOCAL, S3])
def backend(request, tmp_path, monkeypatch) -> Iterator[Backend]:
    if request.param == LOCAL:
        yield LocalBackend(tmp_path / ROOT)
        return
    server: S3Server = request.getfixturevalue("s3_server")
    with pointed_at(server, tmp_path, monkeypatch) as bucket:
        yield S3Backend(server, bucket)


def staged(store: ModelStore, data: bytes) -> StagedFile:
    """`data` written to a staged upload in 1 MiB chunks, as the API writes a request's body."""
    staging = store.stage()
    for start in range(0, len(data), 1 << 20):
        staging.write(data[start : start + (1 << 20)])
    return staging.finish()


def key_of(uri: str, store: ModelStore) -> str:
    return uri.removeprefix((str(store.root) if store.local else store.url) + "/")


def test_bytes_put_read_back_at_a_key_named_by_them_and_again_change_nothing(backend):
    store = ModelStore(backend.url)
    uri, sha256 = store.put(TENANT, NAME, 1, SMALL)
    assert sha256 == hashlib.sha256(SMALL).hexdigest() and store.owns(uri)
    key = key_of(uri, store)
    assert key == f"{TENANT}/{NAME}/1/{sha256}.onnx"
    assert backend.objects() == {key: len(SMALL)}
    assert load(uri, sha256) == SMALL

    assert store.put(TENANT, NAME, 1, SMALL) == (uri, sha256)  # the same bytes again: the same answer
    other_uri, _ = store.put("nlp", NAME, 2, SMALL)  # another tenant, another version: a file of its own
    assert backend.objects() == {key: len(SMALL), key_of(other_uri, store): len(SMALL)}


def test_a_staged_upload_beyond_two_parts_is_published_whole(backend, tmp_path):
    data = os.urandom(LARGE_SIZE)
    store = ModelStore(backend.url)
    upload = staged(store, data)
    assert (upload.size, upload.sha256) == (len(data), sha256_of(data))
    uri, sha256 = store.put(TENANT, NAME, 3, upload)
    upload.remove()
    key = key_of(uri, store)
    assert backend.objects() == {key: LARGE_SIZE}
    expected_parts = 1 if backend.part_size is None else math.ceil(LARGE_SIZE / backend.part_size)
    assert backend.parts(key) == expected_parts  # on S3: 3, a multipart upload
    assert load(uri, sha256) == data
    copy = load_to(uri, sha256, tmp_path / "cache")
    assert copy.read_bytes() == data
    assert load_to(uri, sha256, tmp_path / "cache") == copy  # kept between loads


def test_a_staged_upload_discarded_leaves_nothing(backend):
    store = ModelStore(backend.url)
    staging = store.stage()
    staging.write(SMALL)
    staging.discard()
    assert not staging.path.exists() and backend.objects() == {}


def test_a_file_that_is_not_there_is_missing_for_every_load_and_its_delete_is_no_error(backend, tmp_path):
    store = ModelStore(backend.url)
    sha256 = sha256_of(SMALL)
    uri = store.uri(TENANT, NAME, 1, sha256)
    for read in (lambda: load(uri, sha256), lambda: load_to(uri, sha256, tmp_path / "cache")):
        with pytest.raises(ModelStoreError, match="is missing") as refused:
            read()
        assert not isinstance(refused.value, ChecksumMismatch)
    store.delete(uri)
    assert backend.objects() == {}


def test_changed_bytes_are_refused_by_every_load_with_both_checksums(backend, tmp_path):
    store = ModelStore(backend.url)
    uri, sha256 = store.put(TENANT, NAME, 1, SMALL)
    backend.damage(key_of(uri, store), b"not the published bytes")
    changed = sha256_of(b"not the published bytes")
    for read in (lambda: load(uri, sha256), lambda: load_to(uri, sha256, tmp_path / "cache")):
        with pytest.raises(ChecksumMismatch, match=f"has sha256 {changed}, not the published {sha256}"):
            read()
    assert not (tmp_path / "cache" / f"{sha256}.onnx").exists()  # nothing kept to be used later


def test_delete_removes_its_own_file_only_and_again_is_no_error(backend):
    store = ModelStore(backend.url)
    first, _ = store.put(TENANT, NAME, 1, SMALL)
    second, _ = store.put(TENANT, NAME, 2, SMALL[::-1])
    store.delete(first)
    assert backend.objects() == {key_of(second, store): len(SMALL)}
    store.delete(first)
    for uri in backend.foreign_uris(key_of(second, store)):
        assert not store.owns(uri)
        with pytest.raises(ModelStoreError, match="is not in the model store"):
            store.delete(uri)
    store.delete(second)
    assert backend.objects() == {}


@pytest.mark.parametrize(
    ("tenant", "name", "version"),
    [("team a", NAME, 1), (TENANT, "modèle", 1), (TENANT, "../up", 1), (TENANT, NAME, 0)],
    ids=["a space", "not ASCII", "a path", "version 0"],
)
def test_names_the_store_refuses_write_nothing(backend, tenant, name, version):
    store = ModelStore(backend.url)
    with pytest.raises(ModelStoreError, match="invalid"):
        store.put(tenant, name, version, SMALL)
    with pytest.raises(ModelStoreError, match="invalid sha256"):
        store.uri(TENANT, NAME, 1, "0" * 63)
    assert backend.objects() == {}


def test_a_store_that_cannot_be_written_says_why(backend):
    store = ModelStore(backend.unwritable_url())
    with pytest.raises(ModelStoreError, match="cannot write") as refused:
        store.put(TENANT, NAME, 1, SMALL)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize("kind", ["bytes", "staged"])
def test_a_put_that_fails_midway_leaves_nothing_visible(backend, kind):
    data = SMALL if kind == "bytes" else os.urandom(LARGE_SIZE)
    sha256 = sha256_of(data)
    with backend.failing_midway(allowance=len(data) // 2):
        store = ModelStore(backend.url)
        payload = data if kind == "bytes" else staged(store, data)
        with pytest.raises(ModelStoreError, match="cannot write"):
            store.put(TENANT, NAME, 1, payload)
    assert backend.objects() == {}  # (no temporary file either)
    with pytest.raises(ModelStoreError, match="is missing"):
        load(ModelStore(backend.url).uri(TENANT, NAME, 1, sha256), sha256)
    if isinstance(backend, S3Backend):
        assert backend.cut[0].cut.is_set()  # the link was lost while the request was under way
        # The abort could not reach S3 either: the multipart upload stays unfinished, its parts invisible, until
        # an abort (a bucket's lifecycle rule AbortIncompleteMultipartUpload) ends it.
        unfinished = backend.server.uploads_in_progress(backend.bucket)
        assert unfinished == (
            [f"{backend.prefix}/{TENANT}/{NAME}/1/{sha256}.onnx"] if kind == "staged" else []
        )


def test_an_s3_store_without_s3fs_says_what_to_install(monkeypatch):
    """Where s3fs is not installed (the `s3` extra left out), as fsspec finds it: a line naming the install."""
    from fsspec.registry import _registry as imported  # the filesystems fsspec imported: s3fs's forgotten

    monkeypatch.setitem(sys.modules, "s3fs", None)  # (an import of it fails)
    for protocol in ("s3", "s3a"):
        monkeypatch.delitem(imported, protocol, raising=False)
    with pytest.raises(ModelStoreError, match=re.escape(install_command("s3"))):
        ModelStore("s3://bucket/models")
