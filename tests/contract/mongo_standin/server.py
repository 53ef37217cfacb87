"""The stand-in's server: a TCP listener on a thread and event loop of its own (it outlives each test's
loop), which answers the driver's heartbeats at once and runs every other command whole, one at a time, on
one more thread; the handshake that makes it a replica set's primary or a standalone server, sessions'
transactions, and the `failCommand` fail point. The database commands go to the engine."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import mongomock
from bson import ObjectId

from tests.contract.mongo_standin import speedups, wire
from tests.contract.mongo_standin.cursors import Cursors
from tests.contract.mongo_standin.engine import UNTRACKED, Catalog, Engine
from tests.contract.mongo_standin.errors import CommandError, not_implemented
from tests.contract.mongo_standin.transactions import Transactions

log = logging.getLogger(__name__)

REPLICA_SET = "rs0"
MAX_WIRE_VERSION = 21  # MongoDB 7.0, the deployments' server
ELECTION_ID = ObjectId("7fffffff0000000000000001")
HEARTBEAT = frozenset({"hello", "isMaster", "ismaster"})
"""The handshake and the driver's monitoring: answered on the listener's thread, never behind a long command
(a driver that hears nothing for connectTimeoutMS marks the server unknown and cancels what it has sent)."""


class CloseConnection(Exception):
    """The fail point's `closeConnection`: the connection goes away without a reply."""


class Connection:
    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self._ids)
        self.app_name: str | None = None


class FailPoint:
    """`configureFailPoint: "failCommand"`, as a server started with `enableTestCommands=1` has it: the named
    commands fail with `errorCode` (or lose their connection, or carry a `writeConcernError`), always, a
    number of times, or no longer; only for clients of `appName` when it is given."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.times: int | None = None

    def configure(self, cmd: dict[str, Any]) -> None:
        if cmd["configureFailPoint"] != "failCommand":
            raise not_implemented(f"the fail point {cmd['configureFailPoint']!r}")
        mode = cmd["mode"]
        if mode == "off":
            self.data, self.times = {}, None
        elif mode == "alwaysOn" or (isinstance(mode, dict) and mode.keys() == {"times"}):
            self.data = dict(cmd.get("data") or {})
            self.times = None if mode == "alwaysOn" else int(mode["times"])
        else:
            raise not_implemented(f"the fail point mode {mode!r}")
        unknown = self.data.keys() - {
            "failCommands",
            "errorCode",
            "closeConnection",
            "errorLabels",
            "writeConcernError",
            "appName",
        }
        if unknown:
            raise not_implemented(f"failCommand's {sorted(unknown)}")

    def hits(self, name: str, connection: Connection) -> dict[str, Any] | None:
        """The fail point's data when it fails this command now."""
        if name not in self.data.get("failCommands", ()) or self.times == 0:
            return None
        if self.data.get("appName") not in (None, connection.app_name):
            return None
        if self.times is not None:
            self.times -= 1
        return self.data


class StandInServer:
    def __init__(self, *, replica_set: bool, host: str = "127.0.0.1", port: int = 0):
        speedups.install()
        self.replica_set = replica_set
        self.host, self.port = host, port
        self.committed = mongomock.MongoClient()
        self.cursors = Cursors()
        self.engine = Engine(Catalog(), self.cursors)
        self.transactions = Transactions(self.committed, replica_set)
        self.fail_point = FailPoint()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._commands = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mongo-standin-commands")
        """Where every other command runs, one at a time."""
        self._own: dict[str, Callable[[dict[str, Any], Connection], dict[str, Any] | None]] = {
            "hello": self._hello,
            "isMaster": self._hello,
            "ismaster": self._hello,
            "ping": lambda cmd, connection: None,
            "buildInfo": lambda cmd, connection: {"version": "7.0.0", "versionArray": [7, 0, 0, 0]},
            "endSessions": lambda cmd, connection: self.transactions.end(cmd["endSessions"]),
            "commitTransaction": lambda cmd, connection: self.transactions.commit(cmd),
            "abortTransaction": lambda cmd, connection: self.transactions.abort(cmd),
            "getMore": lambda cmd, connection: self._get_more(cmd),
            "killCursors": lambda cmd, connection: self._kill_cursors(cmd),
            "configureFailPoint": lambda cmd, connection: self.fail_point.configure(cmd),
        }
        """The commands of the server itself; the rest are the database's (`engine.py`)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # --------------------------------------------------------------------------------- the listener

    def start(self) -> None:
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failed), name="mongo-standin", daemon=True
        )
        self._thread.start()
        if not ready.wait(30) or failed:
            raise RuntimeError(f"the MongoDB stand-in did not start: {failed or 'no answer in 30 s'}")

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(30)

    def _run(self, ready: threading.Event, failed: list[BaseException]) -> None:
        try:
            asyncio.run(self._listen(ready))
        except BaseException as exc:  # (said by `start` when it happens before the listener is up)
            failed.append(exc)
            ready.set()

    async def _listen(self, ready: threading.Event) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await self._stopping.wait()
            for writer in list(self._writers):
                writer.close()
        self._commands.shutdown(wait=True, cancel_futures=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        connection, loop = Connection(), asyncio.get_running_loop()
        try:
            while True:
                request_id, flags, cmd = await wire.read_command(reader)
                if next(iter(cmd)) in HEARTBEAT:  # answered at once, while a command runs, as a server does
                    answer = self.execute(cmd, connection)
                else:
                    answer = await loop.run_in_executor(self._commands, self.execute, cmd, connection)
                if not flags & wire.MORE_TO_COME:
                    writer.write(wire.reply(request_id, answer))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, CloseConnection):
            pass
        except wire.ProtocolError as exc:
            log.warning("MongoDB stand-in: closing a connection: %s", exc)
        finally:
            self._writers.discard(writer)
            writer.close()

    # --------------------------------------------------------------------------------- the commands

    def execute(self, cmd: dict[str, Any], connection: Connection) -> dict[str, Any]:
        """The reply to one command (run whole before the next one begins: one thread runs them). A command
        that fails inside a transaction ends the transaction, as on a server."""
        name = next(iter(cmd))
        try:
            failing = self.fail_point.hits(name, connection)
            if failing and failing.get("closeConnection"):
                raise CloseConnection
            if failing and "errorCode" in failing:
                labels = tuple(failing.get("errorLabels", ()))
                raise CommandError(
                    failing["errorCode"], "", "Failing command via 'failCommand' failpoint", labels
                )
            answer = self._execute(name, cmd, connection)
            if failing and "writeConcernError" in failing:
                answer["writeConcernError"] = failing["writeConcernError"]
        except CloseConnection:
            raise
        except Exception as exc:
            if not isinstance(exc, CommandError):  # a gap in the stand-in: said, never a silent wrong answer
                log.exception("MongoDB stand-in: %s failed", name)
                exc = CommandError(1, "InternalError", f"the MongoDB stand-in failed on {name}: {exc!r}")
            answer = exc.document()
        if cmd.get("autocommit") is False and (answer["ok"] != 1 or answer.get("writeErrors")):
            self.transactions.aborted(cmd)
        return answer

    def _execute(self, name: str, cmd: dict[str, Any], connection: Connection) -> dict[str, Any]:
        own = self._own.get(name)
        if own is not None:
            return (own(cmd, connection) or {}) | {"ok": 1.0}
        txn = self.transactions.of(cmd)
        db = (txn.database if txn else self.committed.get_database)(cmd["$db"])
        return self.engine.run(name, db, cmd, txn or UNTRACKED, in_transaction=txn is not None)

    def _get_more(self, cmd: dict[str, Any]) -> dict[str, Any]:
        cursor = self.cursors.more(int(cmd["getMore"]), cmd.get("batchSize"))
        if cursor is None:
            raise CommandError(43, "CursorNotFound", f"cursor id {cmd['getMore']} not found")
        return {"cursor": cursor}

    def _kill_cursors(self, cmd: dict[str, Any]) -> dict[str, Any]:
        killed, unknown = self.cursors.kill([int(c) for c in cmd["cursors"]])
        return {"cursorsKilled": killed, "cursorsNotFound": unknown, "cursorsAlive": [], "cursorsUnknown": []}

    def _hello(self, cmd: dict[str, Any], connection: Connection) -> dict[str, Any]:
        name = next(iter(cmd))
        if "client" in cmd:  # the handshake
            connection.app_name = (cmd["client"].get("application") or {}).get("name")
        answer: dict[str, Any] = {
            "isWritablePrimary" if name == "hello" else "ismaster": True,
            "helloOk": True,
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "maxMessageSizeBytes": wire.MAX_MESSAGE_BYTES,
            "maxWriteBatchSize": 100_000,
            "localTime": datetime.now(UTC),
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": connection.id,
            "minWireVersion": 0,
            "maxWireVersion": MAX_WIRE_VERSION,
            "readOnly": False,
        }
        if self.replica_set:
            answer |= {
                "setName": REPLICA_SET,
                "setVersion": 1,
                "electionId": ELECTION_ID,
                "hosts": [self.address],
                "primary": self.address,
                "me": self.address,
                "secondary": False,
            }
        return answer
