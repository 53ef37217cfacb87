"""The event store's lock timeout is an option of `open_store`: the submit API opens its store with a shorter one
than the other services (5 s, not 30 s), so that a request stuck behind a lock another process holds is
answered 503 (StoreBusy, with Retry-After) before its client gives up waiting (30 s)."""

from __future__ import annotations

import inspect
import sqlite3

import pytest

from gpuyard.client import Client
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.runtime import service
from gpuyard.shared.stores.events import StoreBusy, open_store
from gpuyard.shared.stores.events import sqlite as sqlite_store

SHORT = 0.3


def event(job_id: str):
    return make_event(JobCancelRequested(job_id=job_id, attempt=1, by="ana"), source="/test")


@pytest.fixture
def held(tmp_path):
    """Another process's connection, holding the store's write lock until the test ends."""
    path = tmp_path / "events.db"
    sqlite3.connect(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    yield path, other
    other.close()


async def test_a_store_opened_with_a_short_lock_timeout_gives_up_on_a_held_lock_after_it(tmp_path, held):
    path, other = held
    store = await open_store(f"sqlite:///{path}", lock_timeout=SHORT)
    try:
        assert store.lock_timeout == SHORT and sqlite_store.LOCK_TIMEOUT_SECONDS == 30
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy) as busy:
            await store.append("job", 0, [event("job")])
        assert f"another writer held its lock for {SHORT:g} s" in str(busy.value)  # this store's timeout
        assert busy.value.retry_after > 0
        other.execute("ROLLBACK")
        assert (await store.append("job", 0, [event("job")])).version == 1
    finally:
        await store.close()


async def test_the_submit_api_waits_less_for_the_lock_than_its_clients_wait_for_an_answer(held, monkeypatch):
    path, other = held
    client_timeout = inspect.signature(Client.__init__).parameters["timeout"].default
    assert service.store_lock_timeout("submit") == service.REQUEST_LOCK_TIMEOUT_SECONDS < client_timeout
    for other_service in ("scheduler", "executor", "monitor", "serving"):
        assert service.store_lock_timeout(other_service) is None  # the store's own (30 s)

    monkeypatch.setattr(service, "REQUEST_LOCK_TIMEOUT_SECONDS", SHORT)  # (a fraction of a second here)
    store = await open_store(f"sqlite:///{path}", lock_timeout=service.store_lock_timeout("submit"))
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy, match=f"held its lock for {SHORT:g} s"):
            await store.append("job", 0, [event("job")])
    finally:
        other.execute("ROLLBACK")
        await store.close()


async def test_the_default_lock_timeout_is_the_stores_own(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        assert store.lock_timeout == sqlite_store.LOCK_TIMEOUT_SECONDS
    finally:
        await store.close()


@pytest.mark.parametrize("bad", [0, -1.0])
async def test_a_lock_timeout_that_is_not_positive_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="a lock timeout must be more than 0 seconds"):
        await open_store(f"sqlite:///{tmp_path / 'events.db'}", lock_timeout=bad)
