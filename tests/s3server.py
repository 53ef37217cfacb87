"""An S3-compatible server on loopback for the model store's tests: moto's S3 server (`moto[server]`, its real
HTTP server in a thread of the test process, on 127.0.0.1 and a free port), reached through s3fs exactly as a
user's store is, with the standard AWS variables (`aws_env`); and `CutLink`, a relay in front of it that loses
the network midway through an upload.

moto accepts any key and secret; it refuses a multipart upload's non-final part under 5 MiB, as S3 does. The
buckets and their objects live in the test process's memory, gone when it ends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REGION = "us-east-1"
KEY_ID, SECRET = "gpuyard-test", "gpuyard-test-secret"
UNSET = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")
"""AWS variables a developer's shell may hold that would steer the store elsewhere: the tests unset them."""


def aws_env(endpoint: str, config_dir: Path) -> dict[str, str]:
    """The variables a user sets to point the store at an S3-compatible endpoint (botocore reads them), with
    config and credentials files that do not exist, so that no `~/.aws` plays a part."""
    return {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(config_dir / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(config_dir / "aws-credentials"),
    }


def forget_s3_clients() -> None:
    """Drop s3fs's cached filesystems, whose clients keep the endpoint and settings they were made with: the
    next store reads the environment again."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def pointed_at(server: S3Server, config_dir: Path, monkeypatch: Any) -> Iterator[str]:
    """Within the block, the AWS variables of this process point at `server` (those that would steer elsewhere
    unset) and s3fs forgets the clients it made before and after: a new bucket's name."""
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env(server.endpoint, config_dir).items():
        monkeypatch.setenv(name, value)
    forget_s3_clients()
    try:
        yield server.new_bucket()
    finally:
        forget_s3_clients()


class S3Server:
    """moto's S3 server on 127.0.0.1 (a free port) while in its `with` block; `client()` sees the buckets
    directly (boto3), not through the store under test."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        self._client: Any = None

    def __enter__(self) -> S3Server:
        self._server.start()
        self.address = self._server.get_host_and_port()
        self.endpoint = f"http://{self.address[0]}:{self.address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=REGION,
                aws_access_key_id=KEY_ID,
                aws_secret_access_key=SECRET,
            )
        return self._client

    def new_bucket(self) -> str:
        name = f"models-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)  # (us-east-1: no location constraint, as S3 wants)
        return name

    def objects(self, bucket: str, prefix: str) -> dict[str, int]:
        """The objects under `prefix/`: key below the prefix -> size."""
        found: dict[str, int] = {}
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
        for page in pages:
            for item in page.get("Contents", []):
                found[item["Key"].removeprefix(f"{prefix}/")] = item["Size"]
        return found

    def parts(self, bucket: str, key: str) -> int:
        """How many parts the object was uploaded in: a multipart upload's ETag is `"<md5 of md5s>-<parts>"`,
        a single PUT's the MD5 alone (1)."""
        etag = self.client().head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        return int(etag.partition("-")[2] or 1)

    def uploads_in_progress(self, bucket: str) -> list[str]:
        """The keys of multipart uploads begun and neither completed nor aborted."""
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


class CutLink:
    """A TCP relay on 127.0.0.1 to `target` that passes on the first `allowance` bytes its clients send, then
    cuts every connection and refuses each new one (accepted, then closed at once): the network lost midway
    through an upload, for good."""

    def __init__(self, target: tuple[str, int], allowance: int):
        self.target = target
        self.allowance = allowance
        self.passed = 0
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> CutLink:
        return self

    def __exit__(self, *exc: object) -> None:
        _close(self._listener)
        self._cut()
        for thread in self._threads:
            thread.join(10)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed: the relay is done
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                refused = self.cut.is_set()
                if not refused:
                    self._sockets += [client, upstream]
            if refused:
                _close(client)
                _close(upstream)
                continue
            for source, sink, counted in ((client, upstream, True), (upstream, client, False)):
                pump = threading.Thread(target=self._pump, args=(source, sink, counted), daemon=True)
                pump.start()
                self._threads.append(pump)

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 16):
                if counted:
                    with self._lock:
                        room = max(self.allowance - self.passed, 0)
                        self.passed += min(room, len(chunk))
                    if room < len(chunk):
                        sink.sendall(chunk[:room])
                        self._cut()
                        return
                sink.sendall(chunk)
        _close(sink)

    def _cut(self) -> None:
        with self._lock:
            self.cut.set()
            cut, self._sockets = self._sockets, []
        for sock in cut:
            _close(sock)


def _close(sock: socket.socket) -> None:
    """Shut down (which wakes a thread blocked on it) and close."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
