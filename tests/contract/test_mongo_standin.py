"""The MongoDB stand-in answers as a server does, where the adapters rely on it: the same cases run on the
stand-in (`mongo-standin`) and on a real server (`mongo-real`, where one is found or started), with PyMongo's
async client as the adapters use it."""

from __future__ import annotations

import asyncio

import pytest
from pymongo import AsyncMongoClient, IndexModel
from pymongo.errors import BulkWriteError, OperationFailure

DUPLICATE_KEY = 11000


@pytest.fixture
async def db(mongo_url):
    client: AsyncMongoClient = AsyncMongoClient(mongo_url, tz_aware=True)
    yield client.get_default_database()
    await client.close()


async def test_a_repeated_unique_key_is_a_write_error_at_its_index_and_the_rest_goes_in(db):
    await db.c.create_indexes([IndexModel([("k", 1)], unique=True, name="k")])
    with pytest.raises(BulkWriteError) as refused:
        await db.c.insert_many([{"k": 1}, {"k": 1}, {"k": 2}], ordered=False)
    errors = refused.value.details["writeErrors"]
    assert [(e["index"], e["code"]) for e in errors] == [(1, DUPLICATE_KEY)]
    assert refused.value.details["nInserted"] == 2
    assert sorted([d["k"] async for d in db.c.find({}, {"_id": 0})]) == [1, 2]


async def test_an_index_that_clashes_with_one_held_is_refused_and_the_same_one_again_is_not(db):
    await db.c.create_indexes([IndexModel([("a", 1)], name="x")])
    with pytest.raises(OperationFailure) as same_name:
        await db.c.create_indexes([IndexModel([("b", 1)], name="x")])
    assert same_name.value.code == 86  # IndexKeySpecsConflict
    with pytest.raises(OperationFailure) as same_key:
        await db.c.create_indexes([IndexModel([("a", 1)], name="y")])
    assert same_key.value.code == 85  # IndexOptionsConflict
    await db.c.create_indexes([IndexModel([("a", 1)], name="x")])
    ttl = IndexModel([("at", 1)], name="at", expireAfterSeconds=0)
    await db.c.create_indexes([ttl])
    indexes = await db.c.index_information()
    assert sorted(indexes) == ["_id_", "at", "x"] and indexes["at"]["expireAfterSeconds"] == 0
    assert await db.missing.index_information() == {}


async def test_a_cursor_hands_out_every_document_once_across_batches(db):
    await db.c.insert_many([{"n": n} for n in range(250)])
    assert [d["n"] async for d in db.c.find().sort("n", -1).batch_size(40)] == list(range(249, -1, -1))
    assert len(await db.c.find().to_list()) == 250  # (the first batch, then getMore)


async def test_a_transaction_is_seen_by_others_only_once_committed(db):
    await db.c.insert_one({"_id": "kept"})
    async with db.client.start_session() as session:
        await session.start_transaction()
        await db.c.insert_one({"_id": "new"}, session=session)
        await db.c.delete_one({"_id": "kept"}, session=session)
        assert [d["_id"] async for d in db.c.find({}, session=session)] == ["new"]
        assert [d["_id"] async for d in db.c.find({})] == ["kept"]
        await session.commit_transaction()
        assert [d["_id"] async for d in db.c.find({})] == ["new"]
        await session.start_transaction()
        await db.c.insert_one({"_id": "dropped"}, session=session)
        await session.abort_transaction()
    assert [d["_id"] async for d in db.c.find({})] == ["new"]


async def test_two_transactions_that_change_one_document_never_lose_an_update(db):
    """Both read the counter before either writes: one of them conflicts, `with_transaction` runs it again,
    and it then reads the other's write."""
    await db.c.insert_one({"_id": "counter", "n": 0})
    read_by = set()
    both_read = asyncio.Event()

    async def increment(name: str) -> None:
        async def once(session) -> None:
            doc = await db.c.find_one({"_id": "counter"}, session=session)
            if name not in read_by:  # (the first try of each waits for the other's read)
                read_by.add(name)
                if len(read_by) == 2:
                    both_read.set()
                await both_read.wait()
            await db.c.update_one({"_id": "counter"}, {"$set": {"n": doc["n"] + 1}}, session=session)

        async with db.client.start_session() as session:
            await session.with_transaction(once)

    await asyncio.wait_for(asyncio.gather(increment("a"), increment("b")), 60)
    assert (await db.c.find_one({"_id": "counter"}))["n"] == 2


async def test_a_command_the_server_does_not_know_is_refused(db):
    with pytest.raises(OperationFailure) as unknown:
        await db.command("noSuchCommand")
    assert unknown.value.code == 59  # CommandNotFound
