"""The speed-ups of the core decide exactly what the plain computation decides.

- node groups (`CapacityIndex.placement_candidates`): a policy choosing among one representative per group of
  interchangeable nodes picks the same node as among all nodes;
- the per-(GPU state, free CPUs) score cache of the policies (`PlacementPolicy.best`);
- the per-(shape, priority) answer for blocked jobs (`cycle.SETTLE_BY_SHAPE`);
- the fair-share order's shortcut while nothing is placed (`ordering.in_order`);
- the C-level counting of shapes (`popularity.popularity_for`) and of running jobs (`QuotaLedger`).
"""

from __future__ import annotations

import copy
import heapq
import random
from collections import deque
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.shared.scheduling import (
    Allocation,
    ClusterState,
    JobRequest,
    SchedulerConfig,
)
from gpuyard.shared.scheduling import cycle as cycle_module
from gpuyard.shared.scheduling import index as index_module
from gpuyard.shared.scheduling.cycle import decide
from gpuyard.shared.scheduling.demand import MILLI, demand_of
from gpuyard.shared.scheduling.fragmentation import shape_of, typical_shapes
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import Gpu, Node
from gpuyard.shared.scheduling.nodegroups import NodeGroups
from gpuyard.shared.scheduling.ordering import in_order
from gpuyard.shared.scheduling.placement import POLICIES
from gpuyard.shared.scheduling.placement import base as placement_base
from gpuyard.shared.scheduling.popularity import popularity_for
from gpuyard.shared.scheduling.quota import QuotaLedger
from tests.unit.services.scheduler.builders import GIB, decide_snapshot

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEMPLATES = [  # (model, GPUs, CPUs, memory GiB, GPU memory GiB): few kinds, so alike nodes form groups
    ("A100", 8, 64, 512, 80),
    ("A100", 4, 32, 256, 80),
    ("T4", 2, 16, 64, 16),
    ("T4", 8, 96, 384, 16),
]


@st.composite
def alike_clusters(draw) -> ClusterState:
    kinds = draw(st.lists(st.sampled_from(TEMPLATES), min_size=2, max_size=12))
    nodes = {}
    for i, (model, gpus, cpus, mem, gmem) in enumerate(kinds):
        name = f"n{i:02d}"
        nodes[name] = Node(name, [Gpu(k, model, gmem * GIB) for k in range(gpus)], cpus, mem * GIB)
    return ClusterState(nodes, now=10_000.0)


@st.composite
def queues(draw, prefix: str, count: tuple[int, int] = (1, 40)) -> list[JobRequest]:
    out = []
    for k in range(draw(st.integers(*count))):
        gpus = draw(st.sampled_from([0, 0.25, 0.5, 0.3, 1, 1, 2, 4, 8]))
        out.append(
            JobRequest(
                f"{prefix}{k}",
                draw(st.sampled_from(["a", "b", "c"])),
                gpus=gpus,
                replicas=draw(st.sampled_from([1, 1, 1, 2, 3])),
                cpus=draw(st.sampled_from([0, 1, 2, 4, 8, 12])),
                memory=draw(st.sampled_from([0, 8, 32])) * GIB,
                gpu_memory=draw(st.sampled_from([None, None, None, 8 * GIB, 20 * GIB])),
                gpu_models=draw(st.sampled_from([(), (), (), ("A100",), ("T4",)])),
                priority=draw(st.sampled_from([10, 50, 50, 100])),
                user=draw(st.sampled_from(["u1", "u2"])),
                submitted_at=float(draw(st.integers(0, 100))),
                timeout=draw(st.sampled_from([None, 600.0, 7200.0])),
            )
        )
    return out


configs = st.builds(
    SchedulerConfig,
    policy=st.sampled_from(sorted(POLICIES)),
    fair_share=st.booleans(),
    backfill=st.sampled_from(["easy", "greedy", "off"]),
    preemption=st.booleans(),
    user_gpu_cap=st.sampled_from([{}, {}, {"*": 6.0}]),
    min_runtime_before_preemption=st.sampled_from([0.0, 300.0]),
)
quota_sets = st.sampled_from([{}, {}, {"a": 8.0, "b": 4.0}])


def second_cycle(state: ClusterState, first: list[JobRequest], config: SchedulerConfig) -> ClusterState:
    """Run `first` through one cycle so that the second cycle starts from a partly used cluster."""
    result = decide_snapshot(state, first, config)
    by_id = {j.job_id: j for j in first}
    state.running = [
        Allocation(by_id[p.job_id], p.replicas, state.now - 1000.0, p.borrowed) for p in result.placements
    ]
    return state


@contextmanager
def groups_from_the_start():
    """Node groups even for a handful of fitting nodes (normally built from `GROUP_FROM` on)."""
    saved = index_module.GROUP_FROM
    index_module.GROUP_FROM = -1
    try:
        yield
    finally:
        index_module.GROUP_FROM = saved


def plain(state: ClusterState, queue, config, quotas) -> object:
    """The cycle with every speed-up off: no node groups, no score cache, no per-shape answers."""
    index = CapacityIndex.from_state(state)
    index.grouped = False
    saved_small, saved_settle = placement_base.SMALL, cycle_module.SETTLE_BY_SHAPE
    placement_base.SMALL, cycle_module.SETTLE_BY_SHAPE = -1, False
    try:
        return decide(index, state.running, queue, config, quotas, state.now)
    finally:
        placement_base.SMALL, cycle_module.SETTLE_BY_SHAPE = saved_small, saved_settle


@SETTINGS
@given(alike_clusters(), queues("f"), queues("w"), configs, quota_sets)
def test_fast_cycle_decides_like_the_plain_one(state, first, queue, config, quotas) -> None:
    state.quotas = quotas
    with groups_from_the_start():
        state = second_cycle(state, first, config)
        fast = decide_snapshot(copy.deepcopy(state), queue, config)
    assert fast == plain(state, queue, config, quotas)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_groups_give_the_same_placements_on_a_large_random_cluster(policy: str) -> None:
    """Hundreds of alike nodes and 600 jobs: groups and cache change nothing, for every policy."""
    rng = random.Random(7)
    nodes = {}
    for i in range(160):
        model, gpus, cpus, mem, gmem = TEMPLATES[rng.randrange(len(TEMPLATES))]
        nodes[f"n{i:03d}"] = Node(
            f"n{i:03d}", [Gpu(k, model, gmem * GIB) for k in range(gpus)], cpus, mem * GIB
        )
    queue = [
        JobRequest(
            f"j{k:04d}",
            f"t{k % 4}",
            gpus=rng.choice([0, 0.25, 0.5, 0.3, 1, 1, 2, 4, 8]),
            replicas=rng.choice([1, 1, 1, 2]),
            cpus=rng.choice([0, 1, 2, 4, 8]),
            memory=rng.choice([0, 8, 32]) * GIB,
            gpu_models=rng.choice([(), (), ("T4",), ("A100",)]),
            submitted_at=float(k),
            timeout=3600.0,
        )
        for k in range(600)
    ]
    config = SchedulerConfig(policy=policy)
    state = ClusterState(nodes, now=0.0)
    fast = decide_snapshot(copy.deepcopy(state), queue, config)
    assert len(fast.placements) > 200
    assert fast == plain(state, queue, config, {})


def test_groups_track_every_change_of_a_node() -> None:
    """After random takes and gives, each group's filter values and representative match its nodes."""
    rng = random.Random(3)
    state = ClusterState(
        {
            f"n{i}": Node(f"n{i}", [Gpu(k, "A100", 80 * GIB) for k in range(4)], 32, 256 * GIB)
            for i in range(30)
        }
    )
    index = CapacityIndex.from_state(state)
    index._groups = NodeGroups(index)
    demands = [
        demand_of(JobRequest("x", "t", gpus=g, cpus=c, memory=m * GIB, gpu_memory=gm))
        for g, c, m, gm in [(1, 4, 8, None), (2, 8, 16, None), (0.25, 1, 0, 10 * GIB), (0, 2, 4, None)]
    ]
    assert index.placement_candidates(demands[0]).tolist() == [0]  # all alike: one group, its first node
    taken = []
    for _ in range(400):
        if taken and rng.random() < 0.4:
            i, slots, d = taken.pop(rng.randrange(len(taken)))
            index.give(i, slots, d)
        else:
            d = rng.choice(demands)
            fits = index.candidates(d)
            if not fits.size:
                continue
            i = int(rng.choice(fits.tolist()))
            slots = index.eligible(i, d)[: d.count] if d.count else []
            index.take(i, slots, d)
            taken.append((i, slots, d))
        groups = index._groups
        members: dict[int, list[int]] = {}
        for i in range(len(index)):
            members.setdefault(int(index.group[i]), []).append(i)
        assert -1 not in members
        for g, nodes in members.items():
            assert groups.active[g] and groups.count[g] == len(nodes)
            assert int(groups.rep[g]) == min(nodes)
            assert len({groups.key(i) for i in nodes}) == 1
            assert groups.key_of[g] == groups.key(nodes[0])
            i = nodes[0]
            assert groups.cpu_free[g] == index.cpu_free[i] and groups.idle[g] == index.idle[i]
            assert groups.max_free[g] == index.max_free[i]
        assert int(groups.active[: groups.top].sum()) == len(members)
        for d in demands:  # representatives = the lowest fitting node of each group that fits
            fits = index.candidates(d).tolist()
            expect = sorted({min(n for n in fits if index.group[n] == index.group[i]) for i in fits})
            assert index.placement_candidates(d).tolist() == expect


def _reference_in_order(queue, ledger, fair_share):
    """The order as first written: a heap entry per tenant, re-keyed after every job."""
    ordered = sorted(queue, key=lambda job: (-job.priority, job.submitted_at, job.job_id))
    if not fair_share:
        yield from ordered
        return
    start = 0
    while start < len(ordered):
        priority = ordered[start].priority
        end = start
        tenants: dict[str, deque] = {}
        while end < len(ordered) and ordered[end].priority == priority:
            tenants.setdefault(ordered[end].tenant, deque()).append(ordered[end])
            end += 1
        start = end
        heap = [(ledger.would_borrow(j[0]), ledger.dominant_share(t), t) for t, j in tenants.items()]
        heapq.heapify(heap)
        while heap:
            tenant = heapq.heappop(heap)[-1]
            jobs = tenants[tenant]
            yield jobs.popleft()
            if jobs:
                heapq.heappush(heap, (ledger.would_borrow(jobs[0]), ledger.dominant_share(tenant), tenant))


@SETTINGS
@given(
    queues("q", (0, 60)),
    st.sampled_from([{}, {"a": 4.0, "b": 2.0}]),
    st.booleans(),
    st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_fair_share_order_shortcut_keeps_the_order(queue, quotas, fair_share, placed) -> None:
    """Whatever gets placed along the way, the order is the one of the plain heap algorithm."""
    config = SchedulerConfig(fair_share=fair_share)
    orders = []
    for fn in (in_order, _reference_in_order):
        ledger = QuotaLedger(quotas, [], config, (16.0, 128.0, 1024.0 * GIB))
        out = []
        for k, j in enumerate(fn(queue, ledger, fair_share)):
            out.append(j.job_id)
            if placed[k % len(placed)]:
                ledger.add(j)
        orders.append(out)
    assert orders[0] == orders[1]


def test_running_jobs_end_in_order_of_their_time_limits() -> None:
    """Ends = started_at + timeout (no time limit: never), stable: equal ends keep the running list's order, then
    this cycle's placements."""
    from gpuyard.shared.scheduling.backfill import ending_order

    def alloc(name: str, started: float, timeout: float | None) -> Allocation:
        return Allocation(
            JobRequest(name, "t", gpus=1, timeout=timeout), (name,), started
        )  # replicas: the name

    running = [
        alloc("a", 50, 100),
        alloc("b", 0, None),
        alloc("c", 0, 100),
        alloc("d", 100, 50),
        alloc("e", 10, 5),
    ]
    placed = [(150.0, ("p",)), (20.0, ("q",))]
    got = [(end, replicas[0]) for end, replicas in ending_order(running, placed)]
    assert got == [(15.0, "e"), (20.0, "q"), (100.0, "c"), (150.0, "a"), (150.0, "d"), (150.0, "p")]
    assert list(ending_order([], [])) == []


def test_popularity_and_usage_counted_like_one_by_one() -> None:
    rng = random.Random(5)
    jobs = [
        JobRequest(
            f"j{k}",
            rng.choice("abc"),
            gpus=rng.choice([0, 0.5, 1, 2]),
            replicas=rng.choice([1, 2]),
            cpus=rng.choice([1, 3.152, 4]),
            memory=rng.choice([1, 2]) * GIB,
            gpu_models=rng.choice([(), ("T4",), ("T4", "A100")]),
            user=rng.choice(["u", "v"]),
        )
        for k in range(300)
    ]
    running = [Allocation(j, ()) for j in jobs[200:]]
    config = SchedulerConfig(user_gpu_cap={"*": 100.0})
    assert popularity_for(config, jobs[:200], running) == typical_shapes(shape_of(demand_of(j)) for j in jobs)
    ledger = QuotaLedger({"a": 1.0}, running, config, (10.0, 10.0, 10.0))
    for tenant in "abc":
        mine = [a.job for a in running if a.job.tenant == tenant]
        assert ledger.used(tenant) == pytest.approx(sum(j.total_gpus for j in mine))
        assert ledger.cpus[tenant] == pytest.approx(sum(j.cpus * j.replicas for j in mine))
        for user in "uv":
            held = sum(j.total_gpus for j in mine if j.user == user)
            assert ledger.user_gpus[(tenant, user)] == pytest.approx(held)


def test_index_from_state_reads_shares_and_slices() -> None:
    gpus = [
        Gpu(0, "A100", 80 * GIB, allocated=1.0),
        Gpu(1, "A100", 80 * GIB, allocated=0.25, allocated_memory=GIB),
    ]
    gpus += [Gpu(2, "A100", 80 * GIB, allocated=0.9995), Gpu(3, "A100", 80 * GIB)]
    state = ClusterState({"n": Node("n", gpus, 8, 64 * GIB, allocated_cpus=2)})
    index = CapacityIndex.from_state(state)
    assert index.free == [[0, 750, 0, MILLI]]
    assert index.gpu_memory_free == [[80.0 * GIB, 79.0 * GIB, 80.0 * GIB, 80.0 * GIB]]
    assert index.idle.tolist() == [1] and index.max_free.tolist() == [MILLI]
    assert index.cpu_free.tolist() == [6.0]


def test_gpu_models_given_as_lists_take_the_long_way() -> None:
    """The C-level keys need hashable fields; a list of GPU models falls back to the plain path, same answer."""
    from tests.unit.services.scheduler.builders import cluster, node, running

    def state():
        held = JobRequest("r", "a", gpus=1, gpu_models=["T4"])
        return cluster(
            node("n0", 2, model="T4"), node("n1", 2, model="A100"), running=[running(held, "n0", [0])]
        )

    listed = [JobRequest(f"j{k}", "b", gpus=1, gpu_models=["T4"], submitted_at=k) for k in range(3)]
    tupled = [JobRequest(f"j{k}", "b", gpus=1, gpu_models=("T4",), submitted_at=k) for k in range(3)]
    a, b = decide_snapshot(state(), listed), decide_snapshot(state(), tupled)
    assert a == b
    assert [p.job_id for p in a.placements] == ["j0"] and set(a.pending) == {"j1", "j2"}
