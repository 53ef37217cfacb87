"""One scheduler decides at a time: the lease in NATS KV, and two scheduler processes on one platform.

Real nats-server, real processes: a lease's expiry and compare-and-swap are the server's behaviour.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.runtime.lease import Lease
from tests.integration.conftest import Platform, wait_for

pytestmark = pytest.mark.integration

TTL = 2.0
RENEWALS_PAST_TWO_TTLS = 6
"""A holder renews every third of the lease's length (`Lease.keep`): six renewals span two lengths."""
LOST_LEASE = "lost the scheduler lease"  # what a leader that finds its lease taken logs (`Lease.keep`)


async def eventually(check, *, within: float = 10, what: str) -> None:
    """Ask `check` (a function, or a coroutine function) again and again until it says yes: an
    AssertionError after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        answer = check()
        if asyncio.iscoroutine(answer):
            answer = await answer
        if answer:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.05)


async def holder_now(lease: Lease) -> str:
    """Who holds the lease, as its key in the bucket says."""
    assert lease.kv is not None
    entry = await lease.kv.get(lease.name)
    return json.loads(entry.value or b"")["holder"]


async def lease(url: str, holder: str, ttl: float = 1.5) -> tuple[Bus, Lease]:
    bus = await Bus.connect([url], name=holder, source=f"/test/{holder}")
    held = Lease(bus, "scheduler", holder, ttl=ttl)
    await held.open()
    return bus, held


async def test_one_holder_at_a_time_and_a_lapsed_lease_passes_on(nats_url):
    (bus_a, a), (bus_b, b) = await lease(nats_url, "a"), await lease(nats_url, "b")
    try:
        assert await a.acquire()
        assert not await b.acquire()
        assert await holder_now(b) == "a"
        assert await a.renew() and a.held
        # a stops renewing, as a frozen or dead process would: its key ages out and b's next try takes it
        await eventually(b.acquire, within=a.ttl * 20, what="b to take the lease a stopped renewing")
        assert await holder_now(b) == "b"
        assert not await a.renew() and not a.held  # the old holder learns it lost, never overwrites
    finally:
        await bus_a.close()
        await bus_b.close()


async def test_keep_hands_over_when_the_leader_stops_and_never_overlaps(nats_url):
    (bus_a, a), (bus_b, b) = await lease(nats_url, "a"), await lease(nats_url, "b")
    leading: set[str] = set()
    overlaps: list[set[str]] = []

    def callbacks(name):
        async def gained():
            leading.add(name)
            if len(leading) > 1:
                overlaps.append(set(leading))

        async def lost():
            leading.discard(name)

        return gained, lost

    renew_a, acquire_b = a.renew, b.acquire
    renewed: list[bool] = []  # each renewal of a: whether it kept the lease
    # each try of b: whether it took the lease, and after how many renewals of a it began
    tries: list[tuple[bool, int]] = []

    async def renew_counted() -> bool:
        renewed.append(await renew_a())
        return renewed[-1]

    async def acquire_counted() -> bool:
        after = sum(renewed)
        tries.append((await acquire_b(), after))
        return tries[-1][0]

    a.renew, b.acquire = renew_counted, acquire_counted
    try:
        task_a = asyncio.create_task(a.keep(*callbacks("a")))
        await eventually(lambda: leading == {"a"}, what="a to lead")
        task_b = asyncio.create_task(b.keep(*callbacks("b")))
        # renewals keep it: b tries again after a has renewed for twice the lease's length (a renewal every
        # third of it), when the key a wrote at first would long have aged out without them
        await eventually(
            lambda: any(after >= RENEWALS_PAST_TWO_TTLS for _, after in tries),
            within=a.ttl * 20,
            what="b to try after a has renewed for twice the lease's length",
        )
        assert leading == {"a"} and all(renewed) and not any(took for took, _ in tries)
        task_a.cancel()  # a stops and releases: b takes over within one try
        leading.discard("a")
        await eventually(lambda: leading == {"b"}, within=a.ttl * 20, what="b to take over")
        assert overlaps == []
        task_b.cancel()
    finally:
        await bus_a.close()
        await bus_b.close()


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("leadership")
    p = Platform(base / "data", base / "config", env={"GPUYARD_LEASE_TTL": str(TTL)}).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def scheduler_pid(platform: Platform) -> int:
    return next((s.pid for s in platform.client().services() if s.service == "scheduler"), None)


def freeze_outside_a_write(pid: int, store: Path, tries: int = 20) -> None:
    """SIGSTOP the process at a moment it holds no write lock on the embedded event store. A process frozen
    inside a write keeps SQLite's one write lock until it runs again, and every other writer waits for it (the
    API answers 503): that is SQLite's, not the lease's, and not what the test is about. The witness: a write
    transaction of the test's own begins while the process is frozen; otherwise it runs on until its write is
    done (the lock comes free) and is frozen again."""
    assert store.is_file(), store  # (else the witness would be a new, empty database)
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        if write_lock_free(store, within=2.0):
            return
        os.kill(pid, signal.SIGCONT)
        write_lock_free(store, within=30.0)
    raise AssertionError(f"process {pid} held the event store's write lock at each of {tries} freezes")


def write_lock_free(store: Path, within: float) -> bool:
    """Could a write transaction on the SQLite file begin within `within` seconds? (It is rolled back.)"""
    conn = sqlite3.connect(store, timeout=within)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def placed_by(platform: Platform, job_id: str) -> list[str]:
    events = platform.client().events(job_id)
    return [e.event["source"] for e in events if e.event["type"].endswith("job.placed")]


def test_a_standby_scheduler_takes_over_a_frozen_leader_and_no_job_is_placed_twice(platform, tmp_path):
    client = platform.client()
    primary = wait_for(lambda: scheduler_pid(platform), 20, what="the scheduler's heartbeat")
    log = tmp_path / "standby.log"
    env = {
        **platform.joining_env("scheduler"),
        "GPUYARD_INSTANCE": "standby",
        "GPUYARD_LEASE_TTL": str(TTL),
    }
    standby = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.services.scheduler"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: "following job events" in log.read_text(), 30, what="the standby scheduler to start")
        first = [client.submit({"command": "true", "resources": {"gpus": 1}}).job_id for _ in range(4)]
        for job_id in first:
            assert platform.wait_state(job_id, {"succeeded"}, timeout=40).state == "succeeded"
        # the leader is alive: the standby tried the lease, found it held, and waits
        wait_for(
            lambda: "lease is held by another" in log.read_text(), TTL * 10, what="the standby's first try"
        )
        assert "took the scheduler lease" not in log.read_text()
        assert all(len(placed_by(platform, j)) == 1 for j in first)

        primary_log = platform.data_dir / "logs" / "scheduler.log"
        lost_before = primary_log.read_text().count(LOST_LEASE)
        # frozen, not dead: it must not act on its old lease later
        freeze_outside_a_write(primary, platform.data_dir / "events.db")
        try:
            wait_for(lambda: "took the scheduler lease" in log.read_text(), TTL * 10, what="the takeover")
            second = [client.submit({"command": "true", "resources": {"gpus": 1}}).job_id for _ in range(4)]
            for job_id in second:
                assert platform.wait_state(job_id, {"succeeded"}, timeout=40).state == "succeeded"
                assert placed_by(platform, job_id) == ["/gpuyard/scheduler/standby"]
        finally:
            os.kill(primary, signal.SIGCONT)
        wait_for(  # the old leader wakes up, finds its lease gone and follows
            lambda: primary_log.read_text().count(LOST_LEASE) > lost_before,
            TTL * 20,
            what="the old leader to say it lost the lease",
        )
        third = [client.submit({"command": "true", "resources": {"gpus": 1}}).job_id for _ in range(4)]
        for job_id in first + second + third:
            assert platform.wait_state(job_id, {"succeeded"}, timeout=40).state == "succeeded"
            assert len(placed_by(platform, job_id)) == 1
    finally:
        standby.send_signal(signal.SIGTERM)
        standby.wait(30)
