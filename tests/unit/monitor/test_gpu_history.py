"""The GPU history (shared.gpuhistory): raw samples, their compaction into minute buckets, its bounds, and
the monitor's writer of its own node's samples."""

from __future__ import annotations

import pytest

from services.monitor.history import HistoryWriter
from services.monitor.ingest import SampleIngest
from shared.events import GpuHolder, GpuReading, GpuSample, make_event
from shared.gpuhistory import GpuHistory, GpuPoint, downsample
from shared.settings import MonitorSettings

T0 = 1_800_000_000.0  # a whole minute (divisible by 60)
HOUR = 3600.0


def reading(index: int, util: float | None, *holders: GpuHolder, mem: int = 1000) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        utilization_pct=util,
        memory_used_bytes=mem,
        memory_total_bytes=4000,
        holders=list(holders),
    )


def job(job_id: str, fraction: float = 1.0, tenant: str = "vision") -> GpuHolder:
    return GpuHolder(job_id=job_id, tenant=tenant, user="ana", fraction=fraction)


@pytest.fixture
async def history(tmp_path):
    h = await GpuHistory.open(tmp_path / "gpu_history.db")
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


async def test_compaction_merges_samples_older_than_the_raw_span_and_drops_what_is_past_keeping(history):
    samples = [  # two GPUs, one sample a second, for 3 hours
        GpuPoint.raw("n1", reading(g, 50.0, job(f"j{g}")), T0 + s, 1.0)
        for s in range(0, 3 * 3600)
        for g in (0, 1)
    ]
    await history.add(samples)
    await history.add(samples[:100])  # again: idempotent
    now = T0 + 3 * HOUR
    used_before = sum(h.used for p in await history.points(since=0) for h in p.holders)
    done = await history.compact(now=now, raw_keep=HOUR, bucket=60, keep=7 * 86400)
    assert done.merged == 2 * 2 * 3600 and done.dropped == 0
    counts = await history.count()
    assert counts == {0.0: 2 * 3600, 60.0: 2 * 2 * 60}  # the last hour raw, the two before by minute
    after = await history.points(since=0)
    assert sum(h.used for p in after for h in p.holders) == pytest.approx(used_before)
    assert all(p.t >= now - HOUR for p in after if p.bucket == 0)
    again = await history.compact(now=now, raw_keep=HOUR, bucket=60, keep=7 * 86400)
    assert again.merged == 0 and await history.count() == counts
    # a day later with a keep of 2 hours: only the last 2 hours' points are kept, the rest merged or dropped
    later = now + 86400
    await history.compact(now=later, raw_keep=HOUR, bucket=60, keep=2 * HOUR)
    assert await history.count() == {}


async def test_a_compaction_is_bounded_and_a_late_sample_joins_its_stored_bucket(history):
    await history.add([GpuPoint.raw("n1", reading(0, 100.0, job("a")), T0 + s, 1.0) for s in range(60)])
    first = await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    assert first.merged == 25 and (await history.count()) == {0.0: 35, 60.0: 1}
    await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    await history.compact(now=T0 + 2 * HOUR, raw_keep=HOUR, bucket=60, keep=86400, limit=25)
    [bucket] = await history.points(since=0)
    assert bucket.bucket == 60 and bucket.seconds == 60 and bucket.holder("a").used == pytest.approx(60)


async def test_points_of_a_node_or_a_job_in_a_window(history):
    await history.add(
        [
            GpuPoint.raw("n1", reading(0, 10.0, job("job-1")), T0, 1.0),
            GpuPoint.raw("n1", reading(1, 20.0, job("job-12")), T0, 1.0),
            GpuPoint.raw("n2", reading(0, 30.0, job("job-1", 0.5), job("job-2", 0.5)), T0 + 5, 1.0),
            GpuPoint.raw("n2", reading(0, 30.0), T0 + 10, 1.0),
        ]
    )
    assert [(p.node, p.gpu) for p in await history.points(since=T0, job_id="job-1")] == [("n1", 0), ("n2", 0)]
    assert len(await history.points(since=T0, node="n2")) == 2
    assert len(await history.points(since=T0 + 1, until=T0 + 10)) == 1


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
    monkeypatch.setattr("services.monitor.history.MAX_BUFFERED_SAMPLES", 3)
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
