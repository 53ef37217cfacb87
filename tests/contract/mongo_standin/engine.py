"""The database commands, executed on mongomock: the query language, updates, aggregation and unique indexes
are mongomock's; the commands' shapes, their replies and their errors (write errors by index, duplicate keys
as 11000, index conflicts as 85/86, a document validator's refusal as 121) are the server's.

Each command runs whole before the next one starts (the server runs one command at a time), on the
database it is given: the committed one, or a transaction's snapshot (`transactions.py`), whose `Writes`
records what the command is about to change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import mongomock
from bson import ObjectId
from mongomock.filtering import filter_applies
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

from tests.contract.mongo_standin.cursors import Cursors
from tests.contract.mongo_standin.errors import (
    BAD_VALUE,
    DOCUMENT_VALIDATION_FAILURE,
    DUPLICATE_KEY,
    FAILED_TO_PARSE,
    INDEX_KEY_SPECS_CONFLICT,
    INDEX_NOT_FOUND,
    INDEX_OPTIONS_CONFLICT,
    NAMESPACE_NOT_FOUND,
    OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
    CommandError,
    not_implemented,
)

PASSED_OVER = frozenset(
    {
        "$db",
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "$clusterTime",
        "$readPreference",
        "readConcern",
        "writeConcern",  # (one node: every write is on a majority, and journalled as far as it goes)
        "maxTimeMS",
        "comment",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
    }
)
"""Fields of any command that change nothing here: sessions and transactions are read by the server
(`server.py`), the rest has no meaning on one in-memory node."""
INDEX_OPTIONS = frozenset({"unique", "sparse", "partialFilterExpression", "expireAfterSeconds"})


class Writes(Protocol):
    """What a command is about to change, told before it changes it (a transaction keeps the images)."""

    tracking: bool

    def before(self, db: str, collection: str, ids: list[Any]) -> None: ...

    def created(self, db: str, collection: str, doc_id: Any) -> None: ...


class Untracked:
    """Writes outside a transaction: applied as they come."""

    tracking = False

    def before(self, db: str, collection: str, ids: list[Any]) -> None:
        pass

    def created(self, db: str, collection: str, doc_id: Any) -> None:
        pass


UNTRACKED = Untracked()


class Catalog:
    """What the server keeps beside the documents, outside any transaction: index expiries (kept here, not
    given to mongomock: the stand-in has no TTL monitor, see the package's docstring) and document
    validators."""

    def __init__(self) -> None:
        self.expiries: dict[tuple[str, str, str], Any] = {}
        self.validators: dict[tuple[str, str], dict[str, Any]] = {}

    def forget(self, db: str) -> None:
        self.expiries = {k: v for k, v in self.expiries.items() if k[0] != db}
        self.validators = {k: v for k, v in self.validators.items() if k[0] != db}


class Engine:
    TRANSACTIONAL = frozenset({"find", "aggregate", "insert", "update", "delete"})

    def __init__(self, catalog: Catalog, cursors: Cursors):
        self.catalog = catalog
        self.cursors = cursors
        self.commands: dict[str, Callable[..., dict[str, Any]]] = {
            "find": self.find,
            "aggregate": self.aggregate,
            "insert": self.insert,
            "update": self.update,
            "delete": self.delete,
            "createIndexes": self.create_indexes,
            "listIndexes": self.list_indexes,
            "dropIndexes": self.drop_indexes,
            "collMod": self.coll_mod,
            "dropDatabase": self.drop_database,
        }

    def run(
        self, name: str, db: mongomock.Database, cmd: dict[str, Any], writes: Writes, in_transaction: bool
    ) -> dict[str, Any]:
        command = self.commands.get(name)
        if command is None:
            raise CommandError(59, "CommandNotFound", f"no such command: '{name}'")
        if in_transaction and name not in self.TRANSACTIONAL:
            raise CommandError(
                OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                "OperationNotSupportedInTransaction",
                f"Cannot run '{name}' in a multi-document transaction.",
            )
        try:
            return command(db, cmd, writes) | {"ok": 1.0}
        except NotImplementedError as exc:  # mongomock's own gaps
            raise not_implemented(f"{name}: {exc}") from exc
        except OperationFailure as exc:  # a query or an update mongomock refuses, as the server would
            raise CommandError(exc.code or BAD_VALUE, "BadValue", str(exc)) from exc

    # ------------------------------------------------------------------------------------------ reads

    def find(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "find", {"filter", "projection", "sort", "skip", "limit", "batchSize", "singleBatch"})
        found = db[cmd["find"]].find(cmd.get("filter") or {}, cmd.get("projection") or None)
        if cmd.get("sort"):
            found = found.sort(list(cmd["sort"].items()))
        if cmd.get("skip"):
            found = found.skip(cmd["skip"])
        if cmd.get("limit"):
            found = found.limit(abs(cmd["limit"]))
        docs = list(found)
        single = bool(cmd.get("singleBatch")) or cmd.get("limit", 0) < 0
        return {"cursor": self.cursors.first(_ns(db, cmd["find"]), docs, cmd.get("batchSize"), single)}

    def aggregate(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "aggregate", {"pipeline", "cursor"})
        if not isinstance(cmd["aggregate"], str):
            raise not_implemented("a database-wide aggregate")
        if any(stage.keys() & {"$out", "$merge"} for stage in cmd["pipeline"]):
            raise not_implemented("aggregate's $out and $merge")
        docs = list(db[cmd["aggregate"]].aggregate(cmd["pipeline"]))
        batch_size = (cmd.get("cursor") or {}).get("batchSize")
        return {"cursor": self.cursors.first(_ns(db, cmd["aggregate"]), docs, batch_size)}

    # ------------------------------------------------------------------------------------------ writes

    def insert(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "insert", {"documents", "ordered", "bypassDocumentValidation"})
        name, collection = cmd["insert"], db[cmd["insert"]]
        validator = (
            None if cmd.get("bypassDocumentValidation") else self.catalog.validators.get((db.name, name))
        )
        inserted, errors = 0, []
        for index, doc in enumerate(cmd["documents"]):
            doc.setdefault("_id", ObjectId())
            try:
                if validator is not None and not filter_applies(validator, doc):
                    raise WriteError("Document failed validation", DOCUMENT_VALIDATION_FAILURE)
                collection.insert_one(doc)
            except WriteError as exc:
                errors.append(_write_error(index, exc, db, name))
                if cmd.get("ordered", True):
                    break
                continue
            writes.created(db.name, name, doc["_id"])
            inserted += 1
        return _written(inserted, errors)

    def update(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "update", {"updates", "ordered", "bypassDocumentValidation"})
        name, collection = cmd["update"], db[cmd["update"]]
        matched, modified, upserted, errors = 0, 0, [], []
        for index, spec in enumerate(cmd["updates"]):
            _only(spec, None, {"q", "u", "upsert", "multi"}, what="an update's")
            query, change, upsert, multi = spec["q"], spec["u"], spec.get("upsert", False), spec.get("multi")
            if isinstance(change, list):
                raise not_implemented("updates with an aggregation pipeline")
            replacement = not any(key.startswith("$") for key in change)
            if replacement and multi:
                raise CommandError(
                    FAILED_TO_PARSE,
                    "FailedToParse",
                    "multi update is not supported for replacement-style update",
                )
            if writes.tracking:
                writes.before(db.name, name, _ids(collection, query, 0 if multi else 1))
            try:
                if replacement:
                    result = collection.replace_one(query, change, upsert=upsert)
                elif multi:
                    result = collection.update_many(query, change, upsert=upsert)
                else:
                    result = collection.update_one(query, change, upsert=upsert)
            except WriteError as exc:
                errors.append(_write_error(index, exc, db, name))
                if cmd.get("ordered", True):
                    break
                continue
            matched += result.matched_count
            modified += result.modified_count
            if result.upserted_id is not None:
                upserted.append({"index": index, "_id": result.upserted_id})
                writes.created(db.name, name, result.upserted_id)
        reply = _written(matched + len(upserted), errors) | {"nModified": modified}
        if upserted:
            reply["upserted"] = upserted
        return reply

    def delete(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "delete", {"deletes", "ordered"})
        name, collection = cmd["delete"], db[cmd["delete"]]
        deleted = 0
        for spec in cmd["deletes"]:
            _only(spec, None, {"q", "limit"}, what="a delete's")
            query, one = spec["q"], spec["limit"] == 1
            if writes.tracking:
                writes.before(db.name, name, _ids(collection, query, 1 if one else 0))
            deleted += (collection.delete_one(query) if one else collection.delete_many(query)).deleted_count
        return {"n": deleted}

    # ------------------------------------------------------------------------------------------ catalog

    def create_indexes(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "createIndexes", {"indexes"})
        name, collection = cmd["createIndexes"], db[cmd["createIndexes"]]
        existed = name in db.list_collection_names()
        before = self._indexes(db, name) if existed else {}
        for spec in cmd["indexes"]:
            key, index_name = list(spec["key"].items()), spec["name"]
            options = {k: v for k, v in spec.items() if k not in ("key", "name", "v", "background")}
            if options.keys() - INDEX_OPTIONS:
                raise not_implemented(f"index options {sorted(options.keys() - INDEX_OPTIONS)}")
            options = {k: v for k, v in options.items() if v is not False}
            held = self._indexes(db, name) if name in db.list_collection_names() else {}
            if index_name in held:
                if held[index_name]["key"] != key:
                    raise CommandError(
                        INDEX_KEY_SPECS_CONFLICT,
                        "IndexKeySpecsConflict",
                        f"An existing index has the same name as the requested index but different keys: "
                        f"{index_name}",
                    )
                if {k: v for k, v in held[index_name].items() if k != "key"} != options:
                    raise CommandError(
                        INDEX_OPTIONS_CONFLICT,
                        "IndexOptionsConflict",
                        f"An equivalent index already exists with the same name but different options: "
                        f"{index_name}",
                    )
                continue
            if any(index["key"] == key for index in held.values()):
                raise CommandError(
                    INDEX_OPTIONS_CONFLICT,
                    "IndexOptionsConflict",
                    f"Index already exists with a different name: {index_name}",
                )
            ttl = options.pop("expireAfterSeconds", None)
            collection.create_index(key, name=index_name, **options)
            if ttl is not None:
                self.catalog.expiries[(db.name, name, index_name)] = ttl
        after = self._indexes(db, name)
        return {
            "numIndexesBefore": len(before) or 1,
            "numIndexesAfter": len(after),
            "createdCollectionAutomatically": not existed,
        }

    def list_indexes(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "listIndexes", {"cursor"})
        name = cmd["listIndexes"]
        if name not in db.list_collection_names():
            raise CommandError(
                NAMESPACE_NOT_FOUND, "NamespaceNotFound", f"ns does not exist: {_ns(db, name)}"
            )
        docs = [
            {"v": 2, "key": dict(index.pop("key")), "name": index_name, **index}
            for index_name, index in self._indexes(db, name).items()
        ]
        batch_size = (cmd.get("cursor") or {}).get("batchSize")
        return {"cursor": self.cursors.first(_ns(db, name), docs, batch_size)}

    def drop_indexes(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        """One index, by its name (a server also takes a key, a list of names or "*": not done here)."""
        _only(cmd, "dropIndexes", {"index"})
        name, index_name = cmd["dropIndexes"], cmd["index"]
        if not isinstance(index_name, str) or index_name in ("*", "_id_"):
            raise not_implemented("dropIndexes other than of one index by its name")
        if name not in db.list_collection_names():
            raise CommandError(NAMESPACE_NOT_FOUND, "NamespaceNotFound", f"ns not found {_ns(db, name)}")
        held = self._indexes(db, name)
        if index_name not in held:
            raise CommandError(INDEX_NOT_FOUND, "IndexNotFound", f"index not found with name [{index_name}]")
        db[name].drop_index(index_name)
        self.catalog.expiries.pop((db.name, name, index_name), None)
        return {"nIndexesWas": len(held)}

    def coll_mod(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "collMod", {"validator", "validationLevel", "validationAction"})
        if (
            cmd.get("validationLevel", "strict") != "strict"
            or cmd.get("validationAction", "error") != "error"
        ):
            raise not_implemented("validation levels and actions other than strict and error")
        name = cmd["collMod"]
        if name not in db.list_collection_names():
            raise CommandError(
                NAMESPACE_NOT_FOUND, "NamespaceNotFound", f"ns does not exist: {_ns(db, name)}"
            )
        if "validator" in cmd:
            self.catalog.validators[(db.name, name)] = cmd["validator"]
        return {}

    def drop_database(self, db: mongomock.Database, cmd: dict[str, Any], writes: Writes) -> dict[str, Any]:
        _only(cmd, "dropDatabase", set())
        db.client.drop_database(db.name)
        self.catalog.forget(db.name)
        return {"dropped": db.name}

    def _indexes(self, db: mongomock.Database, name: str) -> dict[str, dict[str, Any]]:
        """Each index of a collection: its key as (field, direction) pairs, and its options."""
        held = {}
        for index_name, index in db[name].index_information().items():
            index.pop("v", None)
            ttl = self.catalog.expiries.get((db.name, name, index_name))
            held[index_name] = index | ({"expireAfterSeconds": ttl} if ttl is not None else {})
        return held


def _only(cmd: dict[str, Any], name: str | None, handled: set[str], what: str | None = None) -> None:
    """Refuse the fields the stand-in would otherwise pass over while a server would act on them."""
    unknown = cmd.keys() - handled - PASSED_OVER - {name}
    if unknown:
        raise not_implemented(f"{what or repr(name)} fields {sorted(unknown)}")


def _ids(collection: mongomock.collection.Collection, query: dict[str, Any], limit: int) -> list[Any]:
    """The `_id`s of the documents a write of `query` takes (all of them when `limit` is 0)."""
    return [d["_id"] for d in collection.find(query, {"_id": 1}).limit(limit)]


def _ns(db: mongomock.Database, collection: str) -> str:
    return f"{db.name}.{collection}"


def _write_error(index: int, exc: WriteError, db: mongomock.Database, collection: str) -> dict[str, Any]:
    if isinstance(exc, DuplicateKeyError) or exc.code == DUPLICATE_KEY:
        message = f"E11000 duplicate key error collection: {_ns(db, collection)} ({exc})"
        return {"index": index, "code": DUPLICATE_KEY, "errmsg": message}
    return {"index": index, "code": exc.code or BAD_VALUE, "errmsg": str(exc)}


def _written(n: int, errors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"n": n, "writeErrors": errors} if errors else {"n": n}
