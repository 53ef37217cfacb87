"""The event store that cannot write (its disk full: SQLITE_FULL, ENOSPC; its lock held by another writer for
the whole lock timeout: "database is locked") raises StoreFull or StoreBusy, both StoreUnavailable, never
SQLite's own error; `POST /v1/jobs` answers them 503 with Retry-After and the reason, never 500, and stores
nothing. Once the store can write again, the same store takes writes: nothing is to be reopened."""

from __future__ import annotations

import asyncio
import errno
import json
import sqlite3

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit import errors
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.stores.events import StoreBusy, StoreFull, StoreUnavailable, open_store
from gpuyard.shared.stores.events import sqlite as sqlite_store
from gpuyard.shared.stores.events.base import unavailable
from tests.unit.services.submit.submitctx import submit_app, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}


def event(job_id: str):
    return make_event(JobCancelRequested(job_id=job_id, attempt=1, by="ana"), source="/test")


def fill(store) -> None:
    """The store's file may not grow by a page more (SQLite answers SQLITE_FULL, as for a full disk)."""
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count = {pages}")


def free(store) -> None:
    store.conn.execute("PRAGMA max_page_count = 1073741823")


@pytest.fixture
def short_lock(monkeypatch):
    """Another writer's lock is waited for a fraction of a second (30 s in service)."""
    monkeypatch.setattr(sqlite_store, "LOCK_TIMEOUT_SECONDS", 0.3)


async def test_a_full_store_raises_store_full_then_takes_writes_once_there_is_room(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        fill(store)
        with pytest.raises(StoreFull) as full:
            for n in range(1000):  # (the pages already there take the first few)
                await store.append(f"job-{n}", 0, [event(f"job-{n}")])
        assert full.value.reason == "disk_full" and full.value.retry_after > 0
        assert "disk is full" in str(full.value) and str(tmp_path) not in str(full.value)
        assert isinstance(full.value.__cause__, sqlite3.OperationalError)
        free(store)
        assert (await store.append("after", 0, [event("after")])).version == 1
    finally:
        await store.close()


async def test_a_lock_held_by_another_writer_past_the_timeout_raises_store_busy(tmp_path, short_lock):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    other = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy) as busy:
            await store.append("job", 0, [event("job")])
        assert busy.value.reason == "busy" and "another writer held its lock" in str(busy.value)
        with pytest.raises(StoreBusy):
            await store.mark_published(["x"])
        other.execute("ROLLBACK")
        assert (await store.append("job", 0, [event("job")])).version == 1
    finally:
        other.close()
        await store.close()


async def test_a_lock_that_outlasted_a_whole_wait_is_not_waited_for_again_at_once(
    tmp_path, short_lock, monkeypatch
):
    """A request whose write gave up on the lock is often tried again at once (the submit fast path, then its
    route; writes queued behind it): while the lock is still held, those give up without a second wait."""
    waits: list[float] = []
    real_sleep = sqlite_store.time.sleep

    def counted(seconds: float) -> None:
        waits.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(sqlite_store.time, "sleep", counted)
    monkeypatch.setattr(sqlite_store, "STUCK_SECONDS", 3600.0)
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    other = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy):
            await store.append("job", 0, [event("job")])
        waited = len(waits)
        assert waited > 0
        results = await asyncio.gather(
            *(store.append(f"job-{n}", 0, [event(f"job-{n}")]) for n in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, StoreBusy) for r in results) and len(waits) == waited  # no wait again
        other.execute("ROLLBACK")
        assert (await store.append("job", 0, [event("job")])).version == 1  # free: written at once
    finally:
        other.close()
        await store.close()


def test_what_each_backend_error_stands_for():
    assert isinstance(unavailable("s", OSError(errno.ENOSPC, "No space left on device")), StoreFull)
    assert isinstance(unavailable("s", OSError(errno.EDQUOT, "Disk quota exceeded")), StoreFull)
    assert isinstance(unavailable("s", sqlite3.OperationalError("database or disk is full")), StoreFull)
    assert isinstance(unavailable("s", sqlite3.OperationalError("database is locked")), StoreBusy)
    io_error = unavailable("s", sqlite3.OperationalError("disk I/O error"))
    assert type(io_error) is StoreUnavailable and io_error.reason == "unavailable"
    assert type(unavailable("s", sqlite3.DatabaseError("file is not a database"))) is StoreUnavailable
    assert unavailable("s", sqlite3.IntegrityError("UNIQUE constraint failed")) is None  # a bug: as it is
    assert unavailable("s", sqlite3.ProgrammingError("closed")) is None


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path) as c:
        yield c


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "route"])
def test_a_submit_to_a_full_store_is_503_with_retry_after_and_stores_nothing(ctx, fast):
    with TestClient(submit_app(ctx, fast=fast)) as api:
        fill(ctx.store)
        answers = [api.post("/v1/jobs", json=SPEC, headers=VISION) for _ in range(50)]
        refused = [a for a in answers if a.status_code != 202]
        assert refused, "the store never filled"
        assert all(a.status_code == 503 for a in refused), [a.text for a in refused]
        assert int(refused[0].headers["Retry-After"]) > 0
        assert "disk is full" in refused[0].json()["detail"]
        accepted = {a.json()["job_id"] for a in answers if a.status_code == 202}
        free(ctx.store)
        again = api.post("/v1/jobs", json=SPEC, headers=VISION)
        assert again.status_code == 202, again.text
        listed = {
            j["job_id"] for j in api.get("/v1/jobs", headers=VISION, params={"limit": 500}).json()["items"]
        }
        assert listed == accepted | {again.json()["job_id"]}  # every 202 kept, every 503 left nothing


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "route"])
def test_a_submit_while_another_writer_holds_the_lock_is_503_with_retry_after(
    ctx, tmp_path, short_lock, fast
):
    other = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    try:
        with TestClient(submit_app(ctx, fast=fast)) as api:
            other.execute("BEGIN IMMEDIATE")
            answer = api.post("/v1/jobs", json=SPEC, headers={**VISION, "Idempotency-Key": "k1"})
            assert answer.status_code == 503, answer.text
            assert int(answer.headers["Retry-After"]) > 0
            assert "another writer held its lock" in answer.json()["detail"]
            other.execute("ROLLBACK")
            again = api.post("/v1/jobs", json=SPEC, headers={**VISION, "Idempotency-Key": "k1"})
            assert again.status_code == 202 and again.json()["duplicate"] is False
    finally:
        other.close()


def test_the_store_never_answers_a_closed_connection_with_sqlites_error(tmp_path):
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    asyncio.run(store.close())
    with pytest.raises(StoreUnavailable):
        asyncio.run(store.append("job", 0, [event("job")]))


def test_the_503_of_a_store_says_its_own_retry_after_and_reason():
    full = errors.unavailable(StoreFull("the event store cannot write: its disk is full"))
    busy = errors.unavailable(StoreBusy("the event store cannot write: another writer held its lock"))
    away = errors.unavailable(StoreUnavailable("cannot reach MongoDB"))
    assert [a.status_code for a in (full, busy, away)] == [503, 503, 503]
    assert [int(a.headers["Retry-After"]) for a in (full, busy, away)] == [30, 5, 2]
    assert json.loads(full.body) == {
        "detail": "temporarily unavailable: the event store cannot write: its disk is full"
    }
