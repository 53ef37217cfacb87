"""One contract suite for both GPU history backends (`gpuyard.shared.stores.gpuhistory.base`): writes, reads by node, job, tenant and
window, the compaction into buckets (bounded, idempotent, never counting a sample twice, also with two monitors
at once), retention, and the usage sums read from it.

The SQLite file always runs, and so does MongoDB's adapter on the stand-in (`mongo-standin`); on a real server
(`mongo-real`) where `tests/contract/conftest.py` finds or starts one, else those cases skip saying why.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from gpuyard.shared.contracts.events.nodes import GpuHolder
from gpuyard.shared.reporting.usage import group, job_usages
from gpuyard.shared.stores.events import StoreUnavailable, open_store
from gpuyard.shared.stores.gpuhistory.base import ORPHAN_AFTER, GpuHistory, GpuPoint, open_gpu_history
from tests.contract.conftest import BACKENDS, SQLITE, failing, fresh_database, refused_url
from tests.unit.services.monitor.gpureadings import reading

T0 = 4_102_444_800.0  # 2100-01-01, a whole hour; far ahead, so that no point is due for a TTL monitor
HOUR = 3600.0
WEEK = 7 * 86400.0


@pytest.fixture(params=BACKENDS)
async def store_url(request, tmp_path) -> str:
    """An event store's URL: the history lives beside it (SQLite) or in its database (MongoDB)."""
    if request.param == SQLITE:
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    async with fresh_database(request, request.param) as url:
        yield url


@pytest.fixture
async def history(store_url) -> GpuHistory:
    h = await open_gpu_history(store_url)
    yield h
    await h.close()


def job(job_id: str, fraction: float = 1.0, tenant: str = "vision", user: str = "ana") -> GpuHolder:
    return GpuHolder(job_id=job_id, tenant=tenant, user=user, fraction=fraction)


def per_second(node: str, gpu: int, util: float, holder: GpuHolder, start: float, seconds: int):
    return [GpuPoint.raw(node, reading(gpu, util, holder), start + s, 1.0) for s in range(seconds)]


def used(points: list[GpuPoint], job_id: str | None = None) -> float:
    return sum(h.used for p in points for h in p.holders if job_id in (None, h.job_id))


async def test_the_backend_follows_the_event_store(store_url, history):
    kind = "Sqlite" if store_url.startswith("sqlite") else "Mongo"
    assert type(history).__name__ == f"{kind}GpuHistory"
    store = await open_store(store_url)
    try:  # the history of an open event store is the same history (the submit API opens it so)
        await history.add([GpuPoint.raw("n1", reading(0, 10.0, job("a")), T0, 1.0)])
        beside = await open_gpu_history(store)
        [p] = await beside.points(since=0)
        assert (p.node, p.holders[0].job_id) == ("n1", "a")
        await beside.close()
        assert await store.get_projection("none") is None  # (the store's own connection is left open)
    finally:
        await store.close()


async def test_points_read_back_by_window_node_job_and_tenant(history):
    await history.add(
        [
            GpuPoint.raw("n1", reading(0, 10.0, job("job-1")), T0, 1.0),
            GpuPoint.raw("n1", reading(1, 20.0, job("job-12", tenant="nlp")), T0, 1.0),
            GpuPoint.raw("n2", reading(0, 30.0, job("job-1", 0.5), job("job-2", 0.5, "nlp")), T0 + 5, 2.0),
            GpuPoint.raw("n2", reading(0, 30.0), T0 + 10, 1.0),
        ]
    )
    everything = await history.points(since=T0)
    assert [(p.node, p.gpu, p.t) for p in everything] == [
        ("n1", 0, T0),
        ("n1", 1, T0),
        ("n2", 0, T0 + 5),
        ("n2", 0, T0 + 10),
    ]
    shared = everything[2]  # read back as written
    assert (shared.seconds, shared.utilization_pct, shared.memory_used_bytes) == (2.0, 30.0, 1000)
    assert shared.memory_total_bytes == 4000 and shared.util_seconds == 2.0
    assert [(h.job_id, h.tenant, h.user, h.fraction, h.seconds) for h in shared.holders] == [
        ("job-1", "vision", "ana", 0.5, 2.0),
        ("job-2", "nlp", "ana", 0.5, 2.0),
    ]
    assert shared.holder("job-2").used == pytest.approx(0.30 * 0.5 * 2.0)
    assert [(p.node, p.gpu) for p in await history.points(since=T0, job_id="job-1")] == [("n1", 0), ("n2", 0)]
    assert [p.t for p in await history.points(since=T0, node="n2")] == [T0 + 5, T0 + 10]
    assert [(p.node, p.gpu) for p in await history.points(since=T0, tenant="nlp")] == [("n1", 1), ("n2", 0)]
    assert len(await history.points(since=T0 + 1, until=T0 + 10)) == 1
    assert await history.points(since=T0, node="n3") == []


async def test_a_sample_written_twice_is_stored_once(history):
    points = per_second("n1", 0, 50.0, job("a"), T0, 10)
    await history.add(points)
    await history.add(points[5:] + per_second("n1", 0, 50.0, job("a"), T0 + 10, 5))
    assert await history.count() == {0.0: 15}
    assert used(await history.points(since=0)) == pytest.approx(15 * 0.5)


async def test_compaction_merges_samples_older_than_the_raw_span_and_drops_what_is_past_keeping(history):
    samples = [  # two GPUs, one sample a second, for 3 hours
        GpuPoint.raw("n1", reading(g, 50.0, job(f"j{g}")), T0 + s, 1.0)
        for s in range(0, 3 * 3600)
        for g in (0, 1)
    ]
    await history.add(samples)
    now = T0 + 3 * HOUR
    used_before = used(samples)
    done = await history.compact(now=now, raw_keep=HOUR, bucket=60, keep=WEEK)
    assert done.merged == 2 * 2 * 3600 and done.dropped == 0
    counts = await history.count()
    assert counts == {0.0: 2 * 3600, 60.0: 2 * 2 * 60}  # the last hour raw, the two before by minute
    after = await history.points(since=0)
    assert used(after) == pytest.approx(used_before)
    assert all(p.t >= now - HOUR for p in after if p.bucket == 0)
    first = next(p for p in after if p.bucket)
    assert (first.t, first.seconds, first.utilization_pct) == (T0, 60, pytest.approx(50.0))
    assert first.holders[0].allocated == pytest.approx(60) and first.holders[0].used == pytest.approx(30)
    assert [h.job_id for p in await history.points(since=0, job_id="j1") for h in p.holders] == ["j1"] * (
        2 * 60 + 3600
    )
    again = await history.compact(now=now, raw_keep=HOUR, bucket=60, keep=WEEK)
    assert again.merged == 0 and await history.count() == counts
    # a day later with a keep of 2 hours: only the last 2 hours' points are kept, the rest merged or dropped
    later = now + 86400
    dropped = await history.compact(now=later, raw_keep=HOUR, bucket=60, keep=2 * HOUR)
    assert await history.count() == {} and dropped.dropped > 0


async def test_a_compaction_is_bounded_and_a_late_sample_joins_its_stored_bucket(history):
    await history.add(per_second("n1", 0, 100.0, job("a"), T0, 50))
    first = await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    assert first.merged == 25 and await history.count() == {0.0: 25, 60.0: 1}
    await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    await history.add(per_second("n1", 0, 100.0, job("a"), T0 + 50, 10))  # late: its bucket is stored
    await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    [bucket] = await history.points(since=0)
    assert bucket.bucket == 60 and bucket.seconds == 60 and bucket.holder("a").used == pytest.approx(60)
    assert await history.count() == {60.0: 1}


async def test_a_monitor_compacts_its_own_node_and_another_only_once_that_ones_monitor_is_gone(history):
    await history.add(
        per_second("n1", 0, 100.0, job("a"), T0, 60) + per_second("n2", 0, 100.0, job("b"), T0, 60)
    )
    now = T0 + HOUR + 120  # both minutes are past the raw span
    mine = await history.compact(now=now, raw_keep=HOUR, bucket=60, keep=WEEK, node="n1")
    assert mine.merged == 60
    assert {(p.node, p.bucket) for p in await history.points(since=0)} == {("n1", 60), ("n2", 0)}
    orphans = await history.compact(
        now=now + ORPHAN_AFTER + 60, raw_keep=HOUR, bucket=60, keep=WEEK, node="n1"
    )
    assert orphans.merged == 60 and await history.count() == {60.0: 2}
    assert used(await history.points(since=0, node="n2")) == pytest.approx(60)


async def test_two_monitors_compacting_at_once_count_every_sample_once(store_url, history):
    samples = [p for g in range(4) for p in per_second("n1", g, 40.0, job(f"j{g}"), T0, 600)]
    await history.add(samples)
    other = await open_gpu_history(store_url)  # another monitor (or one restarted) on the same history
    try:
        done = await asyncio.gather(
            *(
                h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK, limit=limit)
                for h, limit in ((history, 1000), (other, 700), (history, 2500))
            )
        )
    finally:
        await other.close()
    await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK)  # whatever is left
    assert sum(d.merged for d in done) >= len(samples)  # (each took its own, or settled another's)
    assert await history.count() == {60.0: 4 * 10}
    after = await history.points(since=0)
    assert used(after) == pytest.approx(used(samples))
    assert all(p.seconds == 60 and p.holders[0].seconds == 60 for p in after)


async def test_usage_sums_per_tenant_and_user_from_raw_and_compacted_points(history):
    start = T0 - 2 * HOUR
    await history.add(
        per_second("n1", 0, 80.0, job("vis-1", user="ana"), start, 2 * 3600)  # a whole GPU, 2 h at 80 %
        + per_second("n1", 1, 20.0, job("nlp-1", 0.5, "nlp", "bo"), start, 3600)  # half a GPU, 1 h at 20 %
        + per_second("n2", 0, 50.0, job("vis-2", user="cy"), start + 3600, 3600)  # a whole GPU, 1 h at 50 %
    )
    await history.compact(now=T0, raw_keep=HOUR / 2, bucket=60, keep=WEEK, node="n1")
    assert set(await history.count()) == {0.0, 60.0}  # part raw, part in buckets
    points = await history.points(since=start, until=T0)
    usages = job_usages([], points, start, T0)  # (jobs the store no longer lists: counted from the history)
    by_user = {(r.tenant, r.user): round(r.used_gpu_hours, 6) for r in group(usages, "user")}
    assert by_user == {("nlp", "bo"): 0.1, ("vision", "ana"): 1.6, ("vision", "cy"): 0.5}
    by_tenant = {r.tenant: (r.jobs, round(r.allocated_gpu_hours, 6)) for r in group(usages, "tenant")}
    assert by_tenant == {"nlp": (1, 0.5), "vision": (2, 3.0)}
    nlp = job_usages([], await history.points(since=start, until=T0, tenant="nlp"), start, T0)
    assert [(u.job_id, round(u.used / HOUR, 6)) for u in nlp if u.tenant == "nlp"] == [("nlp-1", 0.1)]
    [vis1] = [u for u in usages if u.job_id == "vis-1"]
    assert vis1.mean_utilization_pct == pytest.approx(80.0)
    assert math.isclose(sum(u.used for u in usages) / HOUR, 1.6 + 0.1 + 0.5)


# MongoDB's own: what a single SQLite transaction makes impossible, and the expiry of what no compaction takes


@pytest.fixture
async def mongo_history(mongo_url):
    from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

    h = await MongoGpuHistory.open(mongo_url, raw_keep=HOUR, keep=WEEK)
    yield h
    await h.close()


async def test_mongodb_a_compaction_stopped_before_deleting_its_samples_counts_them_once(mongo_history):
    h = mongo_history
    samples = per_second("n1", 0, 50.0, job("a"), T0, 60)
    await h.add(samples)
    assert await h._merge({("n1", 0, T0): samples}, bucket=60, keep=WEEK) == set()  # stopped here
    assert await h.count() == {0.0: 60, 60.0: 1}
    assert used(await h.points(since=0)) == pytest.approx(used(samples))  # read meanwhile: each once
    await h.add(samples)  # (a flush tried again after it went through)
    await h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK)  # the next compaction
    assert await h.count() == {60.0: 1}
    [bucket] = await h.points(since=0)
    assert bucket.seconds == 60 and bucket.holder("a").used == pytest.approx(used(samples))


async def test_mongodb_points_expire_on_their_own(mongo_history):
    from gpuyard.shared.stores.gpuhistory.mongo import RAW_GRACE

    h = mongo_history
    await h.add(per_second("n1", 0, 50.0, job("a"), T0, 60))
    await h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK)
    await h.add(per_second("n1", 0, 50.0, job("a"), T0 + 60, 1))
    for collection in (h.raw, h.buckets):
        ttl = (await collection.index_information())["expires"]
        assert ttl["key"] == [("expires", 1)] and ttl["expireAfterSeconds"] == 0
    raw = await h.raw.find_one({})
    assert raw["expires"].timestamp() == T0 + 60 + HOUR + RAW_GRACE
    bucket = await h.buckets.find_one({})
    assert bucket["expires"].timestamp() == T0 + WEEK and bucket["merged"] == [T0 + s for s in range(60)]


async def test_mongodb_a_bucket_that_changes_under_every_try_is_left_for_the_next_compaction(mongo_history):
    """Each try finds the bucket changed since it read it (another monitor's compaction, here forced before
    every write): after MAX_TRIES the compaction gives up on it and keeps its samples raw, and the next one
    merges them, each once."""
    from gpuyard.shared.stores.gpuhistory.mongo import MAX_TRIES

    h = mongo_history
    samples = per_second("n1", 0, 50.0, job("a"), T0, 60)
    await h.add(samples)
    await h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK, limit=30)  # a bucket of 30
    buckets, writes = h.buckets, []

    class ChangedBeforeEachWrite:
        def __getattr__(self, name):
            return getattr(buckets, name)

        async def bulk_write(self, requests, **kwargs):
            writes.append(len(requests))
            await buckets.update_many({}, {"$inc": {"version": 1}})  # (another writer got there first)
            return await buckets.bulk_write(requests, **kwargs)

    h.buckets = ChangedBeforeEachWrite()
    given_up = await h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK)
    assert writes == [1] * MAX_TRIES and given_up.merged == 0
    assert await h.count() == {0.0: 30, 60.0: 1}
    assert used(await h.points(since=0)) == pytest.approx(used(samples))  # (read meanwhile: each once)
    h.buckets = buckets
    assert (await h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK)).merged == 30
    [bucket] = await h.points(since=0)
    assert bucket.seconds == 60 and bucket.holder("a").used == pytest.approx(used(samples))


async def test_mongodb_a_sample_the_server_refuses_is_an_error_and_the_rest_is_stored(mongo_history):
    """A refusal other than a duplicate (here a document validator's) is never taken for a sample stored
    already; the other samples of the write are stored all the same (unordered)."""
    h = mongo_history
    await h.db.command("collMod", h.raw.name, validator={"node": {"$ne": "refused"}})
    kept = per_second("n1", 0, 50.0, job("a"), T0, 2)
    await h.add(kept[:1])
    with pytest.raises(StoreUnavailable, match="the GPU history: MongoDB writing samples failed"):
        await h.add(kept + per_second("refused", 0, 50.0, job("a"), T0, 1))
    assert [(p.node, p.t) for p in await h.points(since=0)] == [("n1", T0), ("n1", T0 + 1)]


async def test_mongodb_an_unreachable_server_is_store_unavailable():
    from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

    with (
        refused_url() as url,
        pytest.raises(StoreUnavailable, match="the GPU history: MongoDB creating its indexes failed"),
    ):
        await MongoGpuHistory.open(url, timeout_ms=200)


async def test_mongodb_a_server_that_refuses_is_store_unavailable_for_every_method(mongo_url):
    from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

    async with failing(mongo_url) as url:
        h = await MongoGpuHistory.open(url, raw_keep=HOUR, keep=WEEK)
        calls = {
            "add": lambda: h.add(per_second("n1", 0, 50.0, job("a"), T0, 1)),
            "compact": lambda: h.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=WEEK),
            "points": lambda: h.points(since=0),
            "count": lambda: h.count(),
        }
        wrong = {}
        try:
            for method, call in calls.items():
                try:
                    await call()
                    wrong[method] = "no error"
                except StoreUnavailable:
                    pass
                except Exception as exc:
                    wrong[method] = repr(exc)
        finally:
            await h.close()
        assert wrong == {}
