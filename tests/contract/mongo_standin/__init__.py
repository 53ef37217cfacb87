"""A MongoDB stand-in for the contract suites where no MongoDB server can run: a local TCP server that speaks
MongoDB's wire protocol (OP_MSG) and executes the commands on mongomock, so that the adapters run unchanged
on PyMongo's real `AsyncMongoClient`: its handshake and server selection, BSON both ways, sessions,
`with_transaction` and its retries, cursors and getMore, write errors turned into BulkWriteError /
DuplicateKeyError, command errors into OperationFailure.

It proves: the adapters' commands, queries, updates, sorts, projections and aggregations as mongomock
evaluates them (a reimplementation of the query language, not the server's); unique indexes (an insert or
upsert that repeats a key is refused with 11000); index definitions and their conflicts (85/86); a
transaction's snapshot isolation, with the conflicts of two writers aborting one as a transient error
(`transactions.py`); the replica set path (`?replicaSet=rs0`, transactions) and the standalone one
(`standalone=True`); failures injected as a server started with `enableTestCommands=1` does
(`configureFailPoint: failCommand`, `collMod` validators refusing inserts).

It does not prove, and only a real server does: the server's own query planner and its edge cases (mongomock
matches embedded documents whatever their fields' order, where a server compares them in order); concurrency
(the stand-in runs one command at a time, so two writers interleave only between commands, never inside
one); durability, write concerns and elections; TTL expiry (the stand-in records `expireAfterSeconds` and
expires nothing); the server's limits (document sizes, index key sizes, memory of a $group).

Run one by hand: `python -m tests.contract.mongo_standin [--standalone] [--port N]`.
"""

from __future__ import annotations

from tests.contract.mongo_standin.server import REPLICA_SET, StandInServer


class MongoStandIn:
    """A stand-in server for the lifetime of a `with` block (or between `start` and `stop`)."""

    def __init__(self, *, standalone: bool = False, port: int = 0):
        self.server = StandInServer(replica_set=not standalone, port=port)

    @property
    def url(self) -> str:
        """A URL of database `gpuyard`, as the deployments give it (a replica set is named in it)."""
        query = "" if not self.server.replica_set else f"?replicaSet={REPLICA_SET}"
        return f"mongodb://{self.server.address}/gpuyard{query}"

    def start(self) -> MongoStandIn:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> MongoStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["MongoStandIn"]
