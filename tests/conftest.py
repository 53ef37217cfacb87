"""Fixtures of more than one folder of tests: an S3-compatible server on loopback (`tests/s3server.py`, moto's
server in a thread: one per test module that asks for it) and a new bucket in it, with this process's AWS
variables pointing at the server for the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import S3Server, pointed_at


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def bucket(s3_server, tmp_path, monkeypatch) -> Iterator[str]:
    with pointed_at(s3_server, tmp_path, monkeypatch) as name:
        yield name
