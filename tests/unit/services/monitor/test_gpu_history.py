"""The GPU history's pure parts (gpuyard.shared.stores.gpuhistory.base: raw points, their merging; the MongoDB documents) and the
monitor's writer of its own node's samples. What each backend stores, reads, compacts and drops is the
contract suite's (tests/contract/test_gpu_history.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pymongo.errors import BulkWriteError

from gpuyard.services.monitor.history import HistoryWriter
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuSample
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.stores.events import StoreUnavailable
from gpuyard.shared.stores.gpuhistory.base import Compacted, GpuPoint, downsample, open_gpu_history
from gpuyard.shared.stores.gpuhistory.mongo import _bucket_id, _doc, _duplicates_only, _point, _raw_id
from tests.unit.services.monitor.gpureadings import reading

T0 = 1_800_000_000.0  # a whole minute (divisible by 60)
HOUR = 3600.0


def job(job_id: str, fraction: float = 1.0, tenant: str = "vision") -> GpuHolder:
    return GpuHolder(job_id=job_id, tenant=tenant, user="ana", fraction=fraction)


@pytest.fixture
async def history(tmp_path):
    h = await open_gpu_history(f"sqlite:///{tmp_path / 'events.db'}")
    yield h
    await h.close()


def test_a_raw_point_weighs_the_holders_use_by_utilization_share_and_seconds():
    p = GpuPoint.raw("n1", reading(0, 40.0, job("a", 0.5), job("b", 0.25)), T0, 2.0)
    a, b = p.holders
    assert (a.allocated, a.used) == (0.5 * 2.0, 0.40 * 0.5 * 2.0)
    assert (b.allocated, b.used) == (0.25 * 2.0, 0.40 * 0.25 * 2.0)
    unknown = GpuPoint.raw("n1", reading(0, None, job("a")), T0, 1.0)
    assert unknown.util_seconds == 0 and unknown.holders[0].used == 0


def test_downsampling_keeps_every_sum_and_averages_over_the_seconds():
    points = [GpuPoint.raw("n1", reading(0, 10.0 * i, job("a")), T0 + i, 1.0) for i in range(60)]
    points += [GpuPoint.raw("n1", reading(0, 100.0, job("b", 0.5)), T0 + 60 + i, 1.0) for i in range(30)]
    first, second = downsample(points, 60)
    assert (first.t, first.seconds, second.t, second.seconds) == (T0, 60, T0 + 60, 30)
    assert first.utilization_pct == pytest.approx(sum(10.0 * i for i in range(60)) / 60)
    assert first.holder("a").used == pytest.approx(sum(p.holders[0].used for p in points[:60]))
    assert second.holder("b").allocated == pytest.approx(0.5 * 30) and second.holder("a") is None
    # merged again, coarser: the same sums
    [both] = downsample([first, second], 3600)
    assert both.seconds == 90 and both.holder("a").used == first.holder("a").used
    assert both.utilization_pct == pytest.approx(sum(p.utilization_pct for p in points) / 90)


async def test_the_monitor_writes_its_own_nodes_samples_only(history):
    settings = MonitorSettings(node_name="n1")
    ingest = SampleIngest()
    writer = HistoryWriter(history, settings)
    writer.attach(ingest)
    for node in ("n1", "n2"):
        sample = GpuSample(node=node, gpus=[reading(0, 50.0, job("a")), reading(1, 0.0)], interval_seconds=1)
        ingest.ingest(make_event(sample, source="/test"))
    assert await writer.flush() == 2 and await writer.flush() == 0
    points = await history.points(since=0)
    assert {(p.node, p.gpu) for p in points} == {("n1", 0), ("n1", 1)}


async def test_samples_not_written_are_kept_for_the_next_try_within_the_bound(history, monkeypatch):
    writer = HistoryWriter(history, MonitorSettings(node_name="n1"))
    monkeypatch.setattr("gpuyard.services.monitor.history.MAX_BUFFERED_SAMPLES", 3)
    writer.buffer = type(writer.buffer)(maxlen=3)

    def sample(i: int):
        event = make_event(GpuSample(node="n1", gpus=[reading(0, 10.0 * i)]), source="/test")
        return SampleIngest().ingest(event)

    for i in range(2):
        writer.take(sample(i))
    real_add = history.add

    async def failing(points):
        writer.take(sample(9))  # one more comes while the write is under way
        writer.take(sample(8))
        raise OSError("disk away")

    monkeypatch.setattr(history, "add", failing)
    with pytest.raises(OSError):
        await writer.flush()
    assert [s.sample.gpus[0].utilization_pct for s in writer.buffer] == [10.0, 90.0, 80.0]  # the oldest went
    monkeypatch.setattr(history, "add", real_add)
    assert await writer.flush() == 3 and not writer.buffer


async def test_the_monitor_compacts_as_its_node(history, monkeypatch):
    asked = []

    async def compact(**kwargs):
        asked.append(kwargs)
        return Compacted(merged=0, dropped=0)

    monkeypatch.setattr(history, "compact", compact)
    settings = MonitorSettings(node_name="n1", history_raw_keep=600, history_bucket=30, history_keep=3600)
    await HistoryWriter(history, settings, clock=lambda: T0).compact()
    assert asked == [{"now": T0, "raw_keep": 600, "bucket": 30, "keep": 3600, "node": "n1"}]


def test_a_point_is_the_same_after_its_mongodb_document():
    point = GpuPoint.raw("n1", reading(3, 40.0, job("a", 0.5), job("b", 0.25, "nlp")), T0, 2.0)
    doc = _doc(point, T0 + HOUR)
    assert (doc["jobs"], doc["tenants"]) == (["a", "b"], ["nlp", "vision"])  # (what the indexes serve)
    assert doc["expires"] == datetime.fromtimestamp(T0 + HOUR, UTC)
    assert _point(doc) == point
    [bucket] = downsample([point, GpuPoint.raw("n1", reading(3, None, job("a")), T0 + 2, 1.0)], 60)
    assert _point(_doc(bucket, T0)) == bucket


def test_an_embedded_id_is_built_one_way():
    assert list(_bucket_id("n1", 2, 60, 120)) == ["node", "gpu", "bucket", "t"]
    assert _bucket_id("n1", 2, 60, 120) == {"node": "n1", "gpu": 2, "bucket": 60.0, "t": 120.0}
    assert all(isinstance(v, float) for v in (_raw_id("n1", 0, 5)["t"], _bucket_id("n", 0, 60, 0)["bucket"]))


def test_only_duplicates_are_passed_over():
    def refused(*codes, concern=False):
        details = {"writeErrors": [{"index": i, "code": c} for i, c in enumerate(codes)]}
        details["writeConcernErrors"] = [{"code": 64}] if concern else []
        return BulkWriteError(details)

    assert _duplicates_only(refused(11000, 11000)) == [0, 1]
    for exc in (refused(11000, 121), refused(11000, concern=True)):  # another error; no majority
        with pytest.raises(BulkWriteError):
            _duplicates_only(exc)


async def test_the_monitor_opens_the_history_again_until_it_can(tmp_path, monkeypatch):
    from gpuyard.services.monitor import history as monitor_history

    tries, waits = [], []

    async def opening(url, **spans):
        tries.append((url, spans))
        if len(tries) < 4:
            raise StoreUnavailable("MongoDB away")
        return await open_gpu_history(url, **spans)

    async def waiting(seconds):
        waits.append(seconds)

    monkeypatch.setattr(monitor_history, "open_gpu_history", opening)
    monkeypatch.setattr(monitor_history.asyncio, "sleep", waiting)
    monkeypatch.setattr(monitor_history, "HISTORY_RETRY_MAX", 3.0)
    settings = MonitorSettings(node_name="n1", data_dir=tmp_path, history_raw_keep=600, history_keep=3600)
    history = await monitor_history.open_history(settings)
    try:
        assert waits == [1.0, 2.0, 3.0] and len(tries) == 4
        assert tries[0] == (settings.store_url, {"raw_keep": 600, "keep": 3600})
        await history.add([GpuPoint.raw("n1", reading(0, 5.0), T0, 1.0)])
        assert await history.count() == {0.0: 1}
    finally:
        await history.close()


async def test_an_unreachable_mongodb_is_unavailable_not_a_hang():
    from gpuyard.shared.stores.gpuhistory.mongo import MongoGpuHistory

    with pytest.raises(StoreUnavailable, match="creating its indexes"):
        await MongoGpuHistory.open("mongodb://127.0.0.1:1/gpuyard_none", timeout_ms=200)
    with pytest.raises(ValueError, match="unknown event store URL"):
        await open_gpu_history("postgres://db/x")
