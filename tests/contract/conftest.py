"""Where the contract suites' MongoDB comes from, in one place.

- GPUYARD_TEST_MONGODB_URL, when set: that server (a replica set, for the transactional path).
- Otherwise, when a Docker engine answers: a MongoDB started through testcontainers for the session, as a
  single-node replica set (`--replSet rs0`, initiated here), reached with `directConnection=true`.
- Otherwise the MongoDB cases skip, and the reason says that both are missing.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

MONGO_IMAGE = "mongo:7.0"
BACKENDS = ["sqlite", "mongodb"]


def docker_engine() -> str | None:
    """Why no Docker engine can be used here; None when one answers."""
    try:
        import docker
    except ImportError:
        return "the docker client library is not installed"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:  # no socket, no permission, an engine that does not answer
        return f"no Docker engine answers ({exc.__class__.__name__}: {str(exc)[:160]})"
    return None


def start_replica_set():
    """A throwaway MongoDB as a single-node replica set; (container, URL) once it has a primary."""
    from pymongo import MongoClient
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    container = (
        DockerContainer(MONGO_IMAGE)
        .with_command("--replSet rs0 --bind_ip_all")
        .with_exposed_ports(27017)
        .waiting_for(LogMessageWaitStrategy("Waiting for connections"))
    )
    container.start()
    try:
        host, port = container.get_container_host_ip(), container.get_exposed_port(27017)
        url = f"mongodb://{host}:{port}/gpuyard_test?directConnection=true"
        with MongoClient(url, serverSelectionTimeoutMS=10_000) as client:
            client.admin.command(
                "replSetInitiate", {"_id": "rs0", "members": [{"_id": 0, "host": "localhost:27017"}]}
            )
            deadline = time.monotonic() + 60
            while not client.admin.command("hello").get("isWritablePrimary"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica set elected no primary within 60 s")
                time.sleep(0.2)
        return container, url
    except BaseException:
        container.stop()
        raise


@pytest.fixture(scope="session")
def mongo_url():
    """The MongoDB server URL of this run (see the module's docstring), or a skip that says what is missing."""
    given = os.environ.get("GPUYARD_TEST_MONGODB_URL")
    if given:
        yield given
        return
    missing = docker_engine()
    if missing:
        pytest.skip(
            f"MongoDB cases need a server: GPUYARD_TEST_MONGODB_URL is not set (mongodb://HOST/DB of a replica "
            f"set), and testcontainers cannot start one: {missing}"
        )
    container, url = start_replica_set()
    try:
        yield url
    finally:
        container.stop()


def fresh_mongo_url(base_url: str) -> str:
    """`base_url` with a database of its own, so that cases never see each other's data."""
    base, _, query = base_url.partition("?")
    return f"{base.rstrip('/').rsplit('/', 1)[0]}/gpuyard_test_{uuid.uuid4().hex[:8]}{'?' + query if query else ''}"
