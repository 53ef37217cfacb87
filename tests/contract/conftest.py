"""Where the contract suites' MongoDB comes from, in one place. Each MongoDB case runs once per backend,
named in its id:

- `mongo-standin`: always. The stand-in of `tests/contract/mongo_standin` (a local server that speaks
  MongoDB's wire protocol and executes on mongomock) as a one-member replica set `rs0`, so that the adapters run
  unchanged on PyMongo's `AsyncMongoClient`, transactions included; the event store's suite also runs on it
  as a standalone server (`mongo-standin-standalone`: no transactions, the adapter's other path).
- `mongo-real`: a real server. GPUYARD_TEST_MONGODB_URL when set (a replica set's URL); otherwise, where a
  Docker engine answers, a `mongo:7.0` that testcontainers starts for the session as a single-node replica set
  (`--replSet rs0`, initiated here, with test commands for the fail point). Without either, these cases skip
  and say why.

What the stand-in proves: every line of the adapters runs in CI; their commands, queries, sorts, projections,
updates and aggregations give the contract's answers as mongomock evaluates them; unique indexes refuse a
repeated key (11000) and the adapters turn that into their contract (a duplicate, a ConcurrencyError); a
transaction sees its own snapshot and two conflicting writers abort one as a TransientTransactionError, which
`with_transaction` retries; the replica set and the standalone paths; the failures a server reports (an error
code, a write error, a refused connection) become StoreUnavailable. What only a real server proves: the
server's own query engine (mongomock is a reimplementation: an embedded document matches there whatever its
fields' order, on a server only in order), true concurrency (the stand-in runs one command at a time, so
writers interleave between commands only and a unique index is never raced inside one), conflicts at the
conflicting write (the stand-in reports them at the commit), durability, write concerns and elections, TTL
expiry (the stand-in expires nothing), and the server's limits.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

SQLITE = "sqlite"
MONGO_STANDIN = "mongo-standin"
MONGO_STANDIN_STANDALONE = "mongo-standin-standalone"
MONGO_REAL = "mongo-real"
MONGO_BACKENDS = [MONGO_STANDIN, MONGO_REAL]
BACKENDS = [SQLITE, *MONGO_BACKENDS]
EVENT_STORE_BACKENDS = [SQLITE, MONGO_STANDIN, MONGO_STANDIN_STANDALONE, MONGO_REAL]
MONGO_IMAGE = "mongo:7.0"
REFUSED = 13
"""The code a failing server answers with here (Unauthorized: neither a retryable nor a transient error, so
that the driver passes it on at once)."""
CRUD_COMMANDS = ["find", "aggregate", "insert", "update", "delete"]


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
        .with_command("--replSet rs0 --bind_ip_all --setParameter enableTestCommands=1")
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
def mongo_standin() -> str:
    """The stand-in as a replica set, for the session."""
    from tests.contract.mongo_standin import MongoStandIn

    with MongoStandIn() as standin:
        yield standin.url


@pytest.fixture(scope="session")
def mongo_standin_standalone() -> str:
    """The stand-in as a standalone server (no transactions), for the session."""
    from tests.contract.mongo_standin import MongoStandIn

    with MongoStandIn(standalone=True) as standin:
        yield standin.url


@pytest.fixture(scope="session")
def mongo_real():
    """A real server's URL (see the module's docstring), or a skip that says what is missing."""
    given = os.environ.get("GPUYARD_TEST_MONGODB_URL")
    if given:
        yield given
        return
    missing = docker_engine()
    if missing:
        pytest.skip(
            f"a real MongoDB is needed: GPUYARD_TEST_MONGODB_URL is not set (mongodb://HOST/DB of a replica "
            f"set), and testcontainers cannot start one: {missing}"
        )
    container, url = start_replica_set()
    try:
        yield url
    finally:
        container.stop()


def server_url(request: pytest.FixtureRequest, backend: str) -> str:
    """The server of a MongoDB backend (its session fixture, named as the backend), with a fresh database."""
    return fresh_mongo_url(request.getfixturevalue(backend.replace("-", "_")))


@contextlib.asynccontextmanager
async def fresh_database(request: pytest.FixtureRequest, backend: str) -> AsyncIterator[str]:
    """The URL of a database of its own on a MongoDB backend's server, dropped at the end."""
    from pymongo import AsyncMongoClient

    url = server_url(request, backend)
    try:
        yield url
    finally:
        client: AsyncMongoClient = AsyncMongoClient(url)
        try:
            await client.drop_database(client.get_default_database().name)
        finally:
            await client.close()


@pytest.fixture(params=MONGO_BACKENDS)
async def mongo_url(request) -> AsyncIterator[str]:
    """A fresh database on each MongoDB backend in turn: for the cases of MongoDB's own."""
    async with fresh_database(request, request.param) as url:
        yield url


def fresh_mongo_url(base_url: str) -> str:
    """`base_url` with a database of its own, so that cases never see each other's data."""
    base, _, query = base_url.partition("?")
    return f"{base.rstrip('/').rsplit('/', 1)[0]}/gpuyard_test_{uuid.uuid4().hex[:8]}{'?' + query if query else ''}"


def failing_app() -> str:
    """An application name of its own, for the clients `failing` makes the server refuse."""
    return f"failing-{uuid.uuid4().hex[:8]}"


def with_query(url: str, **params: str) -> str:
    return url + ("&" if "?" in url else "?") + "&".join(f"{k}={v}" for k, v in params.items())


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A MongoDB URL where no server answers: a local port held, bound but not listening, so that every
    connection is refused at once."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"mongodb://127.0.0.1:{held.getsockname()[1]}/gpuyard"


@contextlib.asynccontextmanager
async def failing(
    url: str, commands: list[str] = CRUD_COMMANDS, *, app: str | None = None
) -> AsyncIterator[str]:
    """`url` for clients whose `commands` the server refuses (code REFUSED) until the block ends: the server's
    `failCommand` fail point, for the clients of an application name of their own (`app`, or a new one; the
    rest, the cases' clean-up included, are served as usual). A real server needs `--setParameter
    enableTestCommands=1` (the one testcontainers starts has it); where it has not, the case skips."""
    from pymongo import AsyncMongoClient
    from pymongo.errors import OperationFailure

    app = app or failing_app()
    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        try:
            await client.admin.command(
                "configureFailPoint",
                "failCommand",
                mode="alwaysOn",
                data={"failCommands": commands, "errorCode": REFUSED, "appName": app},
            )
        except OperationFailure as exc:
            pytest.skip(f"this server has no fail points (enableTestCommands=1 is not set): {exc}")
        try:
            yield with_query(url, appName=app)
        finally:
            await client.admin.command("configureFailPoint", "failCommand", mode="off")
    finally:
        await client.close()
