"""Sampling: simulated GPUs follow the real processes of the jobs placed on them (a busy loop reads busy, a
`sleep` idle), the live jobs are kept from the store by what changed, the node sampler adds each GPU's
holders, the ingest keeps each node's latest sample once, and the executor's slice alerts name the tenant."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.services.monitor.cputime import CpuUse, session_cpu_seconds
from gpuyard.services.monitor.ended import EndedFeed
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.jobs import LiveJobs
from gpuyard.services.monitor.platform import PlatformFigures
from gpuyard.services.monitor.sampler import NodeSampler
from gpuyard.services.monitor.simulated import ReplicaPids, SimulatedGpus
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobCancelled,
    JobPending,
    JobPlaced,
    PendingReason,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.nodes import GpuReading, GpuSample
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.gpus.inventory import simulated_gpus
from gpuyard.shared.gpus.nvml import Nvml
from gpuyard.shared.stores.ledger import projection_of
from tests.unit.services.executor.harness import Harness
from tests.unit.services.monitor.test_nvml import FakeGpu, FakeNvml

GIB = 1 << 30
BUSY = f"{sys.executable} -c 'while True: pass'"


@pytest.fixture
async def h(tmp_path):
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()


async def wait_until(check, within: float = 20, what: str = "condition"):
    deadline = time.monotonic() + within
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return value


async def cpu_grew(session: int, by: float) -> None:
    """Until the session has spent `by` more CPU seconds (the measuring window: a busy process's signal)."""
    start = session_cpu_seconds({session})[session]
    await wait_until(lambda: session_cpu_seconds({session})[session] >= start + by, what="CPU time")


async def test_cpu_use_of_a_busy_and_a_sleeping_process_tree():
    # the busy loop is a child: the tree counts, not the first process alone
    busy = await asyncio.create_subprocess_exec("sh", "-c", f"{BUSY} & wait", start_new_session=True)
    idle = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
    try:
        cpu = CpuUse()
        assert cpu.percent({busy.pid, idle.pid}) == {busy.pid: 0.0, idle.pid: 0.0}  # (no interval yet)
        began = time.monotonic()
        await cpu_grew(busy.pid, 0.3)
        use = cpu.percent({busy.pid, idle.pid})
        # a busy loop reads about 100 % of a core on an idle machine; on a loaded one, its share of it
        assert use[busy.pid] >= 0.9 * 0.3 / (time.monotonic() - began) * 100, use
        assert use[busy.pid] > 10 and use[idle.pid] < 2, use
    finally:
        for proc in (busy, idle):
            os.killpg(proc.pid, 9)
            await proc.wait()


async def test_simulated_gpus_follow_the_jobs_placed_on_them(h):
    ex = await h.executor()
    busy = await h.submit(command=BUSY, resources={"gpus": 1})
    sleeper = await h.submit(
        tenant="vision", command="sleep 600", resources={"gpus": 0.5, "gpu_memory": 4 * GIB}
    )
    await h.place(ex, busy, gpus=[[GpuShare(index=0)]])
    await h.place(ex, sleeper, gpus=[[GpuShare(index=1, fraction=0.5, memory_bytes=4 * GIB)]])
    await h.wait(busy, "running")
    await h.wait(sleeper, "running")

    jobs = LiveJobs(h.store)
    await jobs.refresh()
    held = jobs.held_on("node-a")
    assert sorted((x.gpu_index, x.holder.job_id) for x in held) == sorted([(0, busy), (1, sleeper)])
    assert jobs.held_on("node-b") == []
    gpus = SimulatedGpus(simulated_gpus("node-a", 3, "SIM-GPU", 16 * GIB), ReplicaPids(h.data_dir, "node-a"))
    sampler = NodeSampler(simulated=gpus)
    sampler.read(held)  # the start of the interval
    busy_session = ex.backend.sessions((busy, 1))[0]
    await cpu_grew(busy_session, 0.3)
    hot, cold, free = sampler.read(held)

    assert hot.utilization_pct > 10 and hot.memory_used_bytes == 16 * GIB  # (a loaded machine: less than 100)
    assert [(x.job_id, x.tenant, x.user, x.fraction) for x in hot.holders] == [(busy, "team", "ana", 1.0)]
    assert [p.pid for p in hot.processes] == [busy_session]
    assert hot.temperature_c > cold.temperature_c and hot.power_w > cold.power_w
    assert cold.utilization_pct < 2 and cold.memory_used_bytes == 4 * GIB
    assert [(x.job_id, x.tenant, x.fraction, x.memory_bytes) for x in cold.holders] == [
        (sleeper, "vision", 0.5, 4 * GIB)
    ]
    assert free.utilization_pct == 0 and free.memory_used_bytes == 0 and free.holders == []


class CountingStore:
    """The store, counting the jobs listed and those read one by one."""

    def __init__(self, store):
        self.store = store
        self.reads: list[str] = []
        self.listed = 0

    async def versions(self, *, states, created_before=None):
        found = await self.store.versions(states=states, created_before=created_before)
        self.listed += len(found)
        return found

    async def get_projection(self, job_id):
        self.reads.append(job_id)
        return await self.store.get_projection(job_id)


async def test_the_live_jobs_are_read_again_only_when_they_change(h):
    ex = await h.executor()
    queued = await h.submit(command="true")
    placed = await h.submit(command="sleep 600", resources={"gpus": 1})
    store = CountingStore(h.store)
    started = []
    jobs = LiveJobs(store, on_started=started.append, waiting_after=0)  # (every queued job held)
    await jobs.refresh()
    assert sorted(store.reads) == sorted([queued, placed]) and set(jobs.jobs) == {queued, placed}
    store.reads.clear()
    await jobs.refresh()
    assert store.reads == []  # nothing changed: one query, no job read
    reason = PendingReason(code="insufficient_gpus", message="waits")
    await h.ledger.append(queued, JobPending(job_id=queued, attempt=1, reason=reason))
    await jobs.refresh()
    assert store.reads == []  # a queued job's new reason changes nothing the monitor keeps of it

    await h.place(ex, placed, gpus=[[GpuShare(index=0)]])
    await h.wait(placed, "running")
    await jobs.refresh()
    assert store.reads == [placed] and jobs.jobs[placed].state == "running"
    assert [j.job_id for j in started] == [placed]  # seen starting: its submit→running wait counts
    await jobs.refresh()
    assert len(started) == 1

    await ex.stop_attempt((placed, 1), "cancelled", 1)
    await h.wait(placed, "cancelled")
    store.reads.clear()
    await jobs.refresh()
    assert (
        store.reads == [] and placed not in jobs.jobs
    )  # dropped unread: the feed of ends tells how it ended
    assert jobs.held_on("node-a") == []
    assert jobs.ended(placed) and not jobs.ended(placed)  # its start was told, once
    assert not jobs.ended(queued)


async def test_a_deep_queue_costs_a_refresh_nothing_until_its_jobs_are_old_enough_to_alert(h):
    store = CountingStore(h.store)
    jobs = LiveJobs(store, waiting_after=3600)
    for _ in range(300):
        await h.submit(command="true")
    await jobs.refresh()
    await jobs.refresh()
    assert (store.listed, store.reads, jobs.jobs) == (0, [], {})
    jobs.waiting_after = 0  # now they are all old enough for the job-waiting alert to concern them
    await jobs.refresh()
    assert store.listed == 300 and len(store.reads) == 300 and len(jobs.jobs) == 300
    jobs.waiting_after = None  # (no job-waiting alert: no queued job is held)
    await jobs.refresh()
    assert jobs.jobs == {}


async def test_jobs_already_running_when_the_view_begins_are_not_counted_as_starting(h):
    job = await h.submit(command="true", resources={"gpus": 1})
    ex = await h.executor()
    await h.place(ex, job, gpus=[[GpuShare(index=0)]])
    await h.wait(job, "running", "succeeded")
    started = []
    jobs = LiveJobs(h.store, on_started=started.append)
    await jobs.refresh()
    assert started == []


async def test_platform_figures_from_the_live_jobs_and_the_stores_counts(h):
    ex = await h.executor()
    waiting = [await h.submit(tenant="vision", command="true") for _ in range(2)]
    running = await h.submit(tenant="nlp", command="sleep 600", resources={"gpus": 0.5})
    await h.place(ex, running, gpus=[[GpuShare(index=0, fraction=0.5)]])
    await h.wait(running, "running")
    figures = PlatformFigures({"vision": 4, "nlp": 1})
    jobs = LiveJobs(h.store, on_started=figures.started, waiting_after=0)
    await jobs.refresh()
    first = min(jobs.jobs[j].submitted_at for j in waiting)
    now = first + timedelta(seconds=90)
    counts = await h.store.count_by_tenant(states=["queued"])
    oldest = await h.store.oldest_by_tenant(states=["queued"])
    snap = figures.update(jobs, counts, oldest, now)
    assert snap.jobs == {("queued", "vision"): 2, ("running", "nlp"): 1}  # (the queued jobs held: not twice)
    assert snap.queues["vision"].length == 2 and snap.queues["vision"].oldest_wait_seconds == 90
    assert "nlp" not in snap.queues
    assert (snap.quotas["nlp"].guaranteed, snap.quotas["nlp"].used, snap.quotas["nlp"].borrowed) == (
        1,
        0.5,
        0,
    )
    assert (snap.quotas["vision"].guaranteed, snap.quotas["vision"].used) == (4, 0)


async def test_every_end_is_counted_once_and_every_start_wait_once_whatever_the_view_saw(h):
    figures = PlatformFigures({})
    jobs = LiveJobs(h.store, on_started=figures.started)
    feed = EndedFeed(h.store, lambda job: figures.job_ended(job, start_seen=jobs.ended(job.stream_id)))
    ex = await h.executor()

    async def refresh() -> None:
        await jobs.refresh()
        await feed.poll()

    await refresh()
    dropped = await h.submit(tenant="vision", command="true")  # cancelled while it waits: never held
    await h.ledger.append(dropped, JobCancelled(job_id=dropped, attempt=1, by="ana"))
    quick = await h.submit(
        tenant="nlp", command="true", resources={"gpus": 1}
    )  # runs whole between refreshes
    await h.place(ex, quick, gpus=[[GpuShare(index=0)]])
    await h.wait(quick, "succeeded")
    seen = await h.submit(tenant="nlp", command="sleep 600", resources={"gpus": 1})  # seen running, then ends
    await h.place(ex, seen, gpus=[[GpuShare(index=1)]])
    await h.wait(seen, "running")
    await refresh()
    assert figures.ended == {("cancelled", "vision"): 1, ("succeeded", "nlp"): 1}
    assert figures.start_wait.buckets()[0][-1] == ("+Inf", 2)  # quick's from the feed, seen's from the view
    await ex.stop_attempt((seen, 1), "cancelled", 1)
    await h.wait(seen, "cancelled")
    await refresh()
    await refresh()
    assert figures.ended == {("cancelled", "vision"): 1, ("succeeded", "nlp"): 1, ("cancelled", "nlp"): 1}
    assert figures.start_wait.buckets()[0][-1] == ("+Inf", 2)  # seen's start not counted again at its end


async def test_the_feed_of_ends_tells_an_end_stored_late_once(h):
    told = []
    feed = EndedFeed(h.store, told.append)
    early = datetime.now(UTC)
    job = await h.submit(command="true")
    later = await h.submit(command="true")
    await h.ledger.append(later, JobCancelled(job_id=later, attempt=1, by="ana"))
    assert [j.stream_id for j in told] == [] and await feed.poll() == 1
    # an end whose time comes before the latest told, stored after it (another process's slower commit)
    cancel = make_event(JobCancelled(job_id=job, attempt=1, by="ana"), source="/test", time=early)
    view = await h.ledger.load(job)
    await h.store.append(
        job, view.version, [cancel], projection_of(apply(view, cancel, version=view.version + 1))
    )
    assert await feed.poll() == 1 and await feed.poll() == 0
    assert [j.stream_id for j in told] == [later, job]
    before = EndedFeed(h.store, told.append, since=datetime.now(UTC) + timedelta(seconds=1))
    assert await before.poll() == 0  # (ends before the feed began are not its)


def test_the_start_wait_histogram_counts_each_job_in_its_bucket():
    figures = PlatformFigures({})
    for seconds in (0.05, 3, 3, 7200):
        figures.start_wait.observe(seconds)
    buckets, total = figures.start_wait.buckets()
    cumulative = dict(buckets)
    assert cumulative["0.1"] == 1 and cumulative["5.0"] == 3 and cumulative["3600.0"] == 3
    assert cumulative["+Inf"] == 4 and total == pytest.approx(7206.05)


def test_the_nvml_sampler_adds_each_gpus_holders():
    from gpuyard.services.monitor.jobs import HeldGpu
    from gpuyard.shared.contracts.events.nodes import GpuHolder

    sampler = NodeSampler(nvml=Nvml(FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")])).open())
    holder = GpuHolder(job_id="j1", tenant="vision", user="ana")
    first, second = sampler.read([HeldGpu(1, holder, 1)])
    assert first.holders == [] and second.holders == [holder]
    assert not sampler.is_simulated and sampler.count == 2


def sample_event(node: str, when: datetime, util: float = 10.0):
    reading = GpuReading(index=0, uuid=f"{node}-0", utilization_pct=util, memory_total_bytes=GIB)
    return make_event(GpuSample(node=node, gpus=[reading]), source="/test", time=when)


def test_the_ingest_keeps_each_nodes_latest_sample_once():
    clock = [1_000_000.0]
    ingest = SampleIngest(clock=lambda: clock[0])
    seen = []
    unsubscribe = ingest.subscribe(lambda s: seen.append((s.sample.node, s.sample.gpus[0].utilization_pct)))
    t = datetime.fromtimestamp(clock[0] - 0.25, UTC)
    event = sample_event("n1", t, 10)
    assert ingest.ingest(event).lag == pytest.approx(0.25)
    assert ingest.ingest(event) is None  # the same sample again (a redelivery): nothing changes
    assert ingest.ingest(sample_event("n1", t - timedelta(seconds=1), 99)) is None  # overtaken on the way
    assert ingest.ingest_json(sample_event("n2", t, 20).to_json()) is not None
    assert ingest.ingest_json(b"{not json") is None
    assert seen == [("n1", 10), ("n2", 20)]
    assert (ingest.ingested, ingest.ignored) == (2, 3)
    assert [s.sample.node for s in ingest.snapshot()] == ["n1", "n2"]
    clock[0] += 30  # both silent for 30 s (1 s interval): stale, left out
    ingest.ingest(sample_event("n2", datetime.fromtimestamp(clock[0], UTC), 30))
    assert [s.sample.node for s in ingest.snapshot()] == ["n2"]
    unsubscribe()
    ingest.ingest(sample_event("n1", datetime.fromtimestamp(clock[0], UTC)))
    assert len(seen) == 3


def test_a_failing_listener_does_not_stop_the_others():
    ingest = SampleIngest()
    seen = []
    ingest.subscribe(lambda s: 1 / 0)
    ingest.subscribe(seen.append)
    ingest.ingest(sample_event("n1", datetime.now(UTC)))
    assert len(seen) == 1


class Usage:
    def __init__(self):
        self.used = {}

    def __call__(self):
        from gpuyard.services.executor.gpuwatch import GpuProcess

        return [GpuProcess(pid=pid, gpu_index=0, used_bytes=used) for pid, used in self.used.items()]


async def test_slice_alerts_name_the_tenant_and_user_of_the_job(h):
    usage = Usage()
    ex = await h.executor(gpu_reader=usage, gpu_memory_policy="warn", gpu_memory_grace=0)
    job = await h.submit(tenant="vision", command="sleep 60", resources={"gpus": 0.25, "gpu_memory": GIB})
    await h.place(ex, job, gpus=[[GpuShare(index=0, fraction=0.25, memory_bytes=GIB)]])
    await h.wait(job, "running")
    usage.used = {ex.backend.sessions((job, 1))[0]: 2 * GIB}
    await ex.gpu_guard.check()
    [alert] = h.bus.of_kind("gpu_memory_over_slice")
    assert (alert.tenant, alert.user, alert.value, alert.threshold) == ("vision", "ana", 2 * GIB, GIB)
    usage.used = {}
    await ex.gpu_guard.check()
    [resolved] = [e.data for e in h.bus.published if e.type.endswith("alert.resolved")]
    assert resolved.tenant == "vision"


async def test_a_placed_job_holds_its_gpu_before_its_processes_start(h):
    job = await h.submit(command="sleep 600", resources={"gpus": 1})
    await h.ledger.append(
        job,
        JobPlaced(
            job_id=job,
            attempt=1,
            placements=[ReplicaPlacement(replica=0, node="node-a", gpus=[GpuShare(index=0)])],
        ),
    )  # placed, and no executor has started it
    jobs = LiveJobs(h.store)
    await jobs.refresh()
    assert jobs.jobs[job].state == "placed"
    assert [(x.gpu_index, x.holder.job_id, x.attempt) for x in jobs.held_on("node-a")] == [(0, job, 1)]


def test_the_monitor_subscribes_to_every_nodes_samples_only_where_its_bus_user_may(tmp_path, monkeypatch):
    import gpuyard.shared.bus.permissions as perms
    from gpuyard.services.monitor.main import may_listen_to_samples
    from gpuyard.shared.bus.permissions import subject_matches
    from gpuyard.shared.settings.monitor import MonitorSettings

    assert subject_matches("gpu.sample", "gpu.sample") and subject_matches("gpu.>", "gpu.sample")
    assert subject_matches("*.sample", "gpu.sample") and not subject_matches("gpu", "gpu.sample")
    assert not subject_matches("gpu.sample.>", "gpu.sample") and not subject_matches("job.>", "gpu.sample")
    assert may_listen_to_samples(MonitorSettings(nats_credentials=None))  # no bus users: anyone may
    with_user = MonitorSettings(nats_credentials=tmp_path / "monitor.json")
    granted = "gpu.sample" in perms.permissions(perms.Role.MONITOR).subscribe
    assert may_listen_to_samples(with_user) == granted
    grant = perms.GRANTS[perms.Role.MONITOR]
    monkeypatch.setitem(
        perms.GRANTS, perms.Role.MONITOR, perms.Grant(publishes=grant.publishes, listens=("gpu.>",))
    )
    assert may_listen_to_samples(with_user)


class SentBus:
    def __init__(self):
        self.sent = []

    async def send(self, event):
        self.sent.append(event)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def test_each_sample_is_one_event_of_the_whole_node_taken_in_and_published(h):
    from gpuyard.services.monitor.main import Monitor
    from gpuyard.shared.settings.monitor import MonitorSettings

    job = await h.submit(command="sleep 600", resources={"gpus": 1})
    await h.ledger.append(
        job,
        JobPlaced(
            job_id=job,
            attempt=1,
            placements=[ReplicaPlacement(replica=0, node="node-a", gpus=[GpuShare(index=1)])],
        ),
    )
    service = type("S", (), {"store": h.store, "bus": SentBus(), "source": "/test/monitor"})()
    settings = MonitorSettings(node_name="node-a", data_dir=h.data_dir, sample_interval=0.5)
    fake = FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")])
    monitor = Monitor(service, settings, nvml=Nvml(fake).open())
    await monitor.jobs.refresh()
    await monitor.sampling.sample_once()
    [event] = service.bus.sent
    assert event.type == "io.gpuyard.gpu.sample" and event.subject == "node-a"
    sample = event.data
    assert sample.node == "node-a" and not sample.simulated and sample.interval_seconds == 0.5
    assert [g.uuid for g in sample.gpus] == ["GPU-0", "GPU-1"]
    assert [[x.job_id for x in g.holders] for g in sample.gpus] == [[], [job]]
    assert [s.sample for s in monitor.ingest.snapshot()] == [sample]  # its own, without the bus
    assert monitor.sampling.published == 1
