"""Multi-document transactions, with snapshot isolation as a replica set gives them.

A transaction works on its own snapshot: each database it touches is copied from the committed state when
it first touches it, and its reads and writes go to that copy, unseen by everyone else. Before a command
changes a document, the document as the snapshot holds it is kept (`before`). The commit checks that no
document the transaction changed has changed in the committed state since (first committer wins), then
writes the transaction's documents there; a unique index that refuses one of them (another writer took the
key meanwhile) undoes what was written. Either conflict aborts the transaction with WriteConflict, labelled
TransientTransactionError, so that the driver's `with_transaction` runs it again, as it does for a real
server (which reports most conflicts at the conflicting write rather than at the commit).

A command error or a write error inside a transaction aborts it, as on a server: its next command, or its
commit, answers NoSuchTransaction.
"""

from __future__ import annotations

from typing import Any

import bson
import mongomock
from pymongo.errors import DuplicateKeyError

from tests.contract.mongo_standin.errors import (
    ILLEGAL_OPERATION,
    NO_SUCH_TRANSACTION,
    TRANSIENT,
    CommandError,
    write_conflict,
)

Key = tuple[str, str, bytes]
"""A document: database, collection, its `_id` as BSON."""


class Transaction:
    tracking = True

    def __init__(self, committed: mongomock.MongoClient, number: int):
        self.committed = committed
        self.number = number
        self.snapshot = mongomock.MongoClient()
        self.copied: set[str] = set()
        self.images: dict[Key, tuple[Any, dict[str, Any] | None]] = {}
        """Each document the transaction changes: its `_id`, and the document in the snapshot before."""

    def database(self, name: str) -> mongomock.Database:
        if name not in self.copied:
            _copy(self.committed[name], self.snapshot[name])
            self.copied.add(name)
        return self.snapshot[name]

    def before(self, db: str, collection: str, ids: list[Any]) -> None:
        for doc_id in ids:
            key = (db, collection, bson.encode({"_id": doc_id}))
            if key not in self.images:
                self.images[key] = (doc_id, self.snapshot[db][collection].find_one({"_id": doc_id}))

    def created(self, db: str, collection: str, doc_id: Any) -> None:
        self.images.setdefault((db, collection, bson.encode({"_id": doc_id})), (doc_id, None))

    def commit(self) -> None:
        for (db, collection, _), (doc_id, before) in self.images.items():
            if self.committed[db][collection].find_one({"_id": doc_id}) != before:
                raise write_conflict(f"{db}.{collection} {doc_id!r} changed since the transaction's snapshot")
        afters = {
            key: self.snapshot[key[0]][key[1]].find_one({"_id": doc_id})
            for key, (doc_id, _) in self.images.items()
        }
        written: list[Key] = []
        try:
            for key in sorted(
                self.images, key=lambda k: afters[k] is not None
            ):  # deletions first: they free keys
                _put(self.committed[key[0]][key[1]], self.images[key][0], afters[key])
                written.append(key)
        except DuplicateKeyError as exc:
            for key in reversed(written):
                _put(self.committed[key[0]][key[1]], *self.images[key])
            raise write_conflict(f"a unique key was taken since the transaction's snapshot: {exc}") from exc


class Transactions:
    """The open transaction of each session (`lsid`); sessions without one run outside any."""

    def __init__(self, committed: mongomock.MongoClient, replica_set: bool):
        self.committed = committed
        self.replica_set = replica_set
        self.open: dict[bytes, Transaction] = {}
        self.done: dict[bytes, int] = {}
        """The number of each session's last committed transaction (a commit sent again succeeds)."""

    def of(self, cmd: dict[str, Any]) -> Transaction | None:
        """The transaction a command runs in; None outside any (a retryable write also has a txnNumber)."""
        if "txnNumber" in cmd and not self.replica_set:
            raise CommandError(
                ILLEGAL_OPERATION,
                "IllegalOperation",
                "Transaction numbers are only allowed on a replica set member or mongos",
            )
        if cmd.get("autocommit") is not False:
            return None
        session, number = _session(cmd), int(cmd["txnNumber"])
        if cmd.get("startTransaction"):
            self.open[session] = Transaction(self.committed, number)  # (a newer number aborts an older one)
        txn = self.open.get(session)
        if txn is None or txn.number != number:
            raise _no_such(number)
        return txn

    def commit(self, cmd: dict[str, Any]) -> None:
        session, number = _session(cmd), int(cmd["txnNumber"])
        txn = self.open.get(session)
        if txn is None or txn.number != number:
            if self.done.get(session) == number:
                return
            raise _no_such(number)
        del self.open[session]
        txn.commit()
        self.done[session] = number

    def abort(self, cmd: dict[str, Any]) -> None:
        session, number = _session(cmd), int(cmd["txnNumber"])
        txn = self.open.get(session)
        if txn is None or txn.number != number:
            raise _no_such(number)
        del self.open[session]

    def aborted(self, cmd: dict[str, Any]) -> None:
        """A command of the session's transaction failed: the transaction is over."""
        self.open.pop(_session(cmd), None)

    def end(self, sessions: list[dict[str, Any]]) -> None:
        for lsid in sessions:
            key = bytes(lsid["id"])
            self.open.pop(key, None)
            self.done.pop(key, None)


def _session(cmd: dict[str, Any]) -> bytes:
    if "lsid" not in cmd:
        raise CommandError(ILLEGAL_OPERATION, "IllegalOperation", "a transaction's command without a session")
    return bytes(cmd["lsid"]["id"])


def _no_such(number: int) -> CommandError:
    return CommandError(
        NO_SUCH_TRANSACTION,
        "NoSuchTransaction",
        f"Transaction with txnNumber {number} has been aborted or was never started.",
        (TRANSIENT,),
    )


def _copy(source: mongomock.Database, target: mongomock.Database) -> None:
    """A database's collections, indexes and documents, as they are now."""
    for name in source.list_collection_names():
        for index_name, index in source[name].index_information().items():
            if index_name != "_id_":
                options = {k: v for k, v in index.items() if k not in ("key", "v")}
                target[name].create_index(index["key"], name=index_name, **options)
        docs = list(source[name].find())
        if docs:
            target[name].insert_many(docs)


def _put(collection: mongomock.collection.Collection, doc_id: Any, doc: dict[str, Any] | None) -> None:
    """The document of `doc_id` becomes `doc` (None: there is none)."""
    if doc is None:
        collection.delete_one({"_id": doc_id})
    else:
        collection.replace_one({"_id": doc_id}, doc, upsert=True)
