"""Property tests: invariants that hold for any cluster, queue and configuration.

Two depths (`tests/fuzz/depth.py`): the quick run (`make test`) draws clusters of up to 4 nodes and queues of up
to 14 jobs, tens of examples per test; the deep run (`make test-deep`) clusters of up to 64 nodes and queues of
up to 500 jobs, thousands of examples. Queues are drawn as real ones look (a few job shapes, many jobs of each),
which also keeps a 500-job queue cheap to draw and within what hypothesis draws per example: a job is three
draws (its shape, its owner with its time limit, its arrival), a shape's fields are drawn once, and a node is one
draw."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections import defaultdict

from hypothesis import given, target
from hypothesis import strategies as st

from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.scheduling import Allocation, ClusterState, CycleResult, JobRequest, SchedulerConfig
from gpuyard.shared.scheduling.cycle import MAX_PREEMPTION_SEARCHES
from gpuyard.shared.scheduling.model import EPS
from gpuyard.shared.scheduling.placement import POLICIES
from gpuyard.shared.scheduling.reasons import NEVER_HELD
from tests.fuzz.depth import pick, search
from tests.unit.services.scheduler.builders import GIB, cluster, decide_snapshot, node
from tests.unit.services.scheduler.test_fast_paths import groups_from_the_start, plain

NODES = pick((1, 4), (1, 64))
JOBS = pick((1, 14), (1, 500))
MAX_SHAPES = 40  # different job shapes in one queue
TENANTS = ["a", "b", "c"]
OWNERS = [(tenant, user) for tenant in TENANTS for user in ("u1", "u2")]


NODE_KINDS = list(  # (GPUs, model, CPUs, memory GiB, GPU memory GiB): a node is one draw
    itertools.product([8, 4, 2, 1, 0], ["A100", "T4"], [8, 32, 64], [64, 256], [16, 40])
)


@st.composite
def clusters(draw, count: tuple[int, int] = NODES) -> ClusterState:
    kinds = [draw(st.sampled_from(NODE_KINDS)) for _ in range(draw(st.integers(*count)))]
    return cluster(
        *(
            node(f"n{i}", gpus, model, cpus, memory * GIB, gpu_memory * GIB)
            for i, (gpus, model, cpus, memory, gpu_memory) in enumerate(kinds)
        )
    )


@st.composite
def shapes(draw) -> dict:
    """What a job asks for, per replica, and its priority (the fields a cycle tells jobs apart by)."""
    whole = draw(st.sampled_from([True, False]))
    return {
        "gpus": draw(st.sampled_from([1, 2, 4, 8] if whole else [0.5, 0.25, 0.1, 0.75, 0])),
        "replicas": draw(st.sampled_from([1, 1, 1, 2, 3])),
        "cpus": draw(st.sampled_from([0, 1, 4, 16])),
        "memory": draw(st.sampled_from([0, 8, 32])) * GIB,
        "gpu_memory": draw(st.sampled_from([None, None, 8 * GIB, 20 * GIB])),
        "gpu_models": draw(st.sampled_from([(), (), ("A100",), ("T4",)])),
        "priority": draw(st.sampled_from([10, 50, 100])),
    }


SUBMITTERS = [(owner, timeout) for timeout in (None, 600.0, 7200.0) for owner in OWNERS]  # one draw per job


@st.composite
def jobs(draw, prefix: str = "j", count: tuple[int, int] = JOBS) -> list[JobRequest]:
    n = draw(st.integers(*count))
    kinds = [draw(shapes()) for _ in range(draw(st.integers(1, min(n, MAX_SHAPES))))]
    out = []
    for k in range(n):
        shape = kinds[draw(st.integers(0, len(kinds) - 1))]
        (tenant, user), timeout = draw(st.sampled_from(SUBMITTERS))
        submitted_at = float(draw(st.integers(0, 100)))
        out.append(
            JobRequest(f"{prefix}{k}", tenant, user=user, submitted_at=submitted_at, timeout=timeout, **shape)
        )
    return out


# Hypothesis draws its simplest values most (the first of each list): a GPU node, a GPU job, the default
# configuration; the rest come from there.
POLICY_NAMES = sorted(POLICIES, key=lambda p: (p != SchedulerConfig().policy, p))
configs = st.builds(
    SchedulerConfig,
    policy=st.sampled_from(POLICY_NAMES),
    fair_share=st.sampled_from([True, False]),
    backfill=st.sampled_from(["easy", "greedy", "off"]),
    reservation_depth=st.sampled_from([8, 1, 2]),
    preemption=st.sampled_from([True, False]),
    borrowing=st.sampled_from([True, False]),
    user_gpu_cap=st.sampled_from([{}, {"*": 4.0}, {"a": 2.0}]),
)
quotas = st.sampled_from([{}, {"a": 4.0}, {"a": 2.0, "b": 6.0}])


def place_all(state: ClusterState, queue: list[JobRequest], config: SchedulerConfig) -> list[Allocation]:
    """Run one cycle on `state`; return the new allocations (the state's nodes are updated by `decide_snapshot`)."""
    by_id = {j.job_id: j for j in queue}
    result = decide_snapshot(state, queue, config)
    return [Allocation(by_id[p.job_id], p.replicas, state.now, p.borrowed) for p in result.placements]


def check_capacity(state: ClusterState) -> None:
    for n in state.nodes.values():
        assert n.allocated_cpus <= n.cpus + 1e-6
        assert n.allocated_memory <= n.memory
        for g in n.gpus:
            assert g.allocated <= 1.0 + 1e-9
            assert g.allocated_memory <= g.memory


def check_cycle(
    before: ClusterState,
    after: ClusterState,
    queue: list[JobRequest],
    config: SchedulerConfig,
    result: CycleResult,
) -> None:
    """What holds after any cycle: `before` is the cluster it started from, `after` the same with the cycle's
    placements applied (`decide_snapshot`)."""
    check_capacity(after)
    placed = {p.job_id for p in result.placements}
    # every job is either placed or has a reason, never both
    assert placed.isdisjoint(result.pending)
    assert placed | set(result.pending) == {j.job_id for j in queue}
    assert all(isinstance(r.code, PendingCode) and r.message for r in result.pending.values())
    # places in line: 1, 2, ... for the jobs some node could hold; none for the others, which take no place
    in_line = [r.position for r in result.pending.values() if r.code not in NEVER_HELD]
    assert sorted(in_line) == list(range(1, len(in_line) + 1))
    assert all(r.position is None for r in result.pending.values() if r.code in NEVER_HELD)

    by_id = {j.job_id: j for j in queue}
    for p in result.placements:
        j = by_id[p.job_id]
        assert len(p.replicas) == j.replicas  # gang: all replicas or nothing
        for r in p.replicas:
            want = int(j.gpus) if j.gpus >= 1 else (1 if j.gpus > 0 else 0)
            assert len(r.gpus) == want
            assert len({g.index for g in r.gpus}) == want
            gpus = before.nodes[r.node].gpus
            assert all(gpus[a.index].usable for a in r.gpus)
            models = {gpus[a.index].model for a in r.gpus}
            assert not j.gpu_models or models <= set(j.gpu_models)

    # user caps hold for what runs and what this cycle placed
    cap = config.user_gpu_cap
    held: dict[tuple[str, str], float] = defaultdict(float)
    for job in [a.job for a in before.running] + [by_id[p.job_id] for p in result.placements]:
        held[(job.tenant, job.user)] += job.total_gpus
    for (tenant, _user), gpus in held.items():
        limit = cap.get(tenant, cap.get("*"))
        assert limit is None or gpus <= limit + 1e-9

    # without borrowing, no tenant goes above its guarantee
    if before.quotas and not config.borrowing:
        per_tenant = tenant_gpus(before.running)
        for p in result.placements:
            per_tenant[by_id[p.job_id].tenant] += by_id[p.job_id].total_gpus
        for tenant, gpus in per_tenant.items():
            assert gpus <= before.quotas.get(tenant, 0.0) + 1e-9
        assert not any(p.borrowed for p in result.placements)


def tenant_gpus(running: list[Allocation]) -> dict[str, float]:
    used: dict[str, float] = defaultdict(float)
    for alloc in running:
        used[alloc.job.tenant] += alloc.job.total_gpus
    return used


@search(quick=60, deep=3000)
@given(clusters(), jobs(), configs, quotas)
def test_one_cycle_invariants(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig, q
) -> None:
    state.quotas = q
    before = copy.deepcopy(state)
    result = decide_snapshot(state, queue, config)
    check_cycle(before, state, queue, config, result)


@search(quick=60, deep=1500)
@given(clusters(), jobs(), configs, quotas)
def test_deterministic(state: ClusterState, queue: list[JobRequest], config: SchedulerConfig, q) -> None:
    state.quotas = q
    other = copy.deepcopy(state)
    assert decide_snapshot(state, queue, config) == decide_snapshot(other, list(reversed(queue)), config)


def fillers(state: ClusterState) -> list[JobRequest]:
    """A low-priority 1-GPU job per GPU of the cluster, of each tenant in turn: what keeps a cluster busy."""
    count = sum(len(n.gpus) for n in state.nodes.values())
    return [
        JobRequest(f"f{i}", TENANTS[i % len(TENANTS)], gpus=1, priority=10, user="u1", submitted_at=200.0)
        for i in range(count)
    ]


def run_first(
    state: ClusterState, first: list[JobRequest], config: SchedulerConfig, elapsed: float
) -> list[JobRequest]:
    """Place `first` at time 0 and let it run for `elapsed` seconds; return the jobs that still wait."""
    state.now = 0.0
    state.running = place_all(state, first, config)
    state.now = elapsed
    started = {a.job.job_id for a in state.running}
    return [j for j in first if j.job_id not in started]


@search(quick=60, deep=1500)
@given(
    clusters(),
    jobs("r", count=pick((1, 14), (1, 250))),
    jobs("w", count=pick((1, 14), (1, 250))),
    configs,
    quotas,
    st.sampled_from([1000.0, 100.0]),
    st.sampled_from([True, False]),
)
def test_preemption_takes_only_what_the_rules_allow(
    state: ClusterState,
    first: list[JobRequest],
    second: list[JobRequest],
    config: SchedulerConfig,
    q,
    elapsed: float,
    urgent: bool,
) -> None:
    """A busy cluster (what a first cycle placed, then every GPU left taken by a filler), run for `elapsed`
    seconds; more jobs arrive (`urgent`: all of the highest priority). The invariants of any cycle hold, and
    every victim is one the rules let its preemptor take (`scheduling/preemption.py`): it has run its minimum, and it
    has a lower priority, or (with quotas) it is another tenant's borrowed work, which a reclaim takes whatever
    its priority. Hypothesis steers towards cycles with many preemptions, and reclaims (`target`)."""
    state.quotas = q
    if urgent:
        second = [dataclasses.replace(j, priority=1000) for j in second]
    queue = run_first(state, first + fillers(state), config, elapsed) + second
    before = copy.deepcopy(state)
    result = decide_snapshot(state, queue, config)
    check_cycle(before, state, queue, config, result)

    victims = [p.job_id for p in result.preemptions]
    running = {a.job.job_id: a for a in before.running}
    assert len(victims) == len(set(victims)) and set(victims) <= set(running)
    assert not result.preemptions or config.preemption
    waiting = {j.job_id: j for j in queue}
    used = tenant_gpus(before.running)
    for p in result.preemptions:
        victim, by = running[p.job_id], waiting[p.by_job]
        assert result.pending[by.job_id].code == PendingCode.PREEMPTING
        assert elapsed - victim.started_at >= config.min_runtime_before_preemption
        lower = victim.job.priority < by.priority
        assert p.reason == ("priority" if lower else "reclaim")
        if not q or victim.job.tenant == by.tenant:
            assert lower
        else:  # another tenant's: borrowed work (its tenant holds more than its guarantee)
            assert used[victim.job.tenant] > q.get(victim.job.tenant, 0.0) + EPS
            # and a reclaim stays within the preemptor's own guarantee
            assert lower or used[by.tenant] + by.total_gpus <= q.get(by.tenant, 0.0) + EPS
    target(float(len(victims)), label="preemptions")
    target(float(sum(p.reason == "reclaim" for p in result.preemptions)), label="reclaims")


@search(quick=60, deep=2000)
@given(
    st.integers(1, pick(3, 64)),
    st.integers(0, pick(8, 256)),
    st.integers(0, pick(12, 300)),
    st.sampled_from(POLICY_NAMES),
)
def test_guarantee_is_reclaimed_from_borrowers(
    nodes: int, guarantee: int, borrowers: int, policy: str
) -> None:
    """Tenant b fills the cluster with borrowed 1-GPU jobs; tenant a (guaranteed `guarantee` GPUs) gets all of
    its guarantee back within a few cycles (a cycle searches victims for a bounded number of jobs), by
    preempting only borrowed work."""
    capacity = 4 * nodes
    guarantee = min(guarantee, capacity)
    state = cluster(
        *[node(f"n{i}", 4) for i in range(nodes)], quotas={"a": float(guarantee), "b": 0.0}, now=0.0
    )
    config = SchedulerConfig(policy=policy, min_runtime_before_preemption=0)
    fill = [
        JobRequest(f"b{k}", "b", gpus=1, priority=1000, submitted_at=k)
        for k in range(min(borrowers, capacity))
    ]
    state.running = place_all(state, fill, config)
    assert all(a.borrowed for a in state.running)  # b has no guarantee: everything it runs is borrowed

    want = [JobRequest(f"a{k}", "a", gpus=1, priority=10, submitted_at=100 + k) for k in range(guarantee)]
    waiting = list(want)
    cycles = 3 + guarantee // MAX_PREEMPTION_SEARCHES
    for cycle in range(1, cycles + 1):
        state.now = 1000.0 * cycle
        result = decide_snapshot(state, waiting, config)
        check_capacity(state)
        by_id = {j.job_id: j for j in waiting}
        state.running += [
            Allocation(by_id[p.job_id], p.replicas, state.now, p.borrowed) for p in result.placements
        ]
        victims = {p.job_id for p in result.preemptions}
        assert all(v.startswith("b") for v in victims)
        for alloc in [a for a in state.running if a.job.job_id in victims]:
            state.running.remove(alloc)
            for r in alloc.replicas:  # the service would free the victim's GPUs after the grace period
                n = state.nodes[r.node]
                for g in r.gpus:
                    n.gpus[g.index].allocated -= g.fraction
        placed = {p.job_id for p in result.placements}
        waiting = [j for j in waiting if j.job_id not in placed]
        if not waiting:
            break
    assert not waiting, f"tenant a still waits for {len(waiting)} of its {guarantee} guaranteed GPUs"
    held_by_a = sum(a.job.total_gpus for a in state.running if a.job.tenant == "a")
    assert held_by_a == guarantee


def _snapshot(index) -> tuple:
    return (
        [list(r) for r in index.free],
        [list(r) for r in index.gpu_memory_free],
        index.cpu_free.tolist(),
        index.mem_free.tolist(),
        index.idle.tolist(),
        index.state.tolist(),
    )


@search(quick=60, deep=3000)
@given(clusters(), jobs(count=pick((1, 6), (1, 60))), st.sampled_from(POLICY_NAMES))
def test_partial_gang_never_holds_capacity(state: ClusterState, queue: list[JobRequest], policy: str) -> None:
    """place_gang either places every replica or leaves the capacity exactly as it was."""
    from gpuyard.shared.scheduling.demand import demand_of
    from gpuyard.shared.scheduling.fragmentation import shape_of, typical_shapes
    from gpuyard.shared.scheduling.gang import place_gang
    from gpuyard.shared.scheduling.index import CapacityIndex
    from gpuyard.shared.scheduling.placement import make_policy

    index = CapacityIndex.from_state(state)
    chooser = make_policy(policy, typical_shapes(shape_of(demand_of(j)) for j in queue))
    for j in queue:
        before = _snapshot(index)
        taken = place_gang(index, chooser, demand_of(j), j.replicas)
        if taken is None:
            assert _snapshot(index) == before
        else:
            assert len(taken) == j.replicas


def replicas_that_fit(n, j: JobRequest) -> int:
    """How many replicas of `j` an idle node holds, counted from the job's request alone (no scheduler code):
    its CPUs and memory, and the GPUs of an allowed model (whole: idle GPUs with at least `gpu_memory`; a
    share: as many shares per GPU as its thousandths and its memory slice allow)."""
    limit = j.replicas
    if j.cpus:
        limit = min(limit, int(n.cpus // j.cpus))
    if j.memory:
        limit = min(limit, n.memory // j.memory)
    allowed = [g for g in n.gpus if not j.gpu_models or g.model in j.gpu_models]
    if j.gpus >= 1:
        eligible = [g for g in allowed if g.memory >= (j.gpu_memory or 0)]
        limit = min(limit, len(eligible) // int(j.gpus))
    elif j.gpus > 0:
        milli = math.ceil(round(j.gpus * 1000, 6))
        per_gpu = [
            min(1000 // milli, g.memory // j.gpu_memory if j.gpu_memory else 1000 // milli) for g in allowed
        ]
        limit = min(limit, sum(per_gpu))
    return limit


def fits_idle(state: ClusterState, j: JobRequest) -> bool:
    return sum(replicas_that_fit(n, j) for n in state.nodes.values()) >= j.replicas


def no_limits(backfill: tuple[str, ...] = ("easy", "greedy", "off")) -> st.SearchStrategy[SchedulerConfig]:
    """Configurations without quotas or user caps: nothing but the cluster's capacity stands in the way."""
    return st.builds(
        SchedulerConfig,
        policy=st.sampled_from(POLICY_NAMES),
        fair_share=st.sampled_from([True, False]),
        backfill=st.sampled_from(backfill),
        preemption=st.sampled_from([True, False]),
        borrowing=st.sampled_from([True, False]),
    )


@search(quick=60, deep=5000)
@given(clusters(), jobs(count=(1, 1)), no_limits())
def test_a_job_that_fits_an_idle_cluster_is_placed_in_that_cycle(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig
) -> None:
    """Alone in the queue, a job is placed in the first cycle exactly when the idle cluster holds it (a
    scheduler that places nothing, or too much, fails here)."""
    (j,) = queue
    result = decide_snapshot(state, queue, config)
    assert ([p.job_id for p in result.placements] == [j.job_id]) == fits_idle(state, j), {
        k: r.message for k, r in result.pending.items()
    }


@search(quick=60, deep=2000)
@given(clusters(), jobs(count=pick((2, 10), (2, 500))), no_limits(backfill=("easy", "greedy")))
def test_an_idle_cluster_places_something_when_any_job_fits(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig
) -> None:
    """With backfill (easy or greedy), a queue behind a head that does not fit still gets the jobs that do:
    an idle cluster never ends a cycle with nothing placed while one of the waiting jobs fits it."""
    fitting = [j.job_id for j in queue if fits_idle(state, j)]
    result = decide_snapshot(state, queue, config)
    assert bool(result.placements) == bool(fitting), (fitting, {k: r.code for k, r in result.pending.items()})


@search(quick=20, deep=1000)
@given(
    clusters(),
    jobs("r", count=pick((1, 14), (1, 250))),
    jobs("w", count=pick((1, 14), (1, 250))),
    configs,
    quotas,
    st.sampled_from([False, True]),
)
def test_the_fast_paths_decide_like_the_plain_cycle(
    state: ClusterState,
    first: list[JobRequest],
    second: list[JobRequest],
    config: SchedulerConfig,
    q,
    busy: bool,
) -> None:
    """On a partly used cluster (`busy`: every GPU taken, so that jobs preempt), the cycle with its speed-ups
    (node groups, score cache, one answer per blocked shape: `test_fast_paths.py`) decides exactly what the
    plain computation decides; long queues of a few shapes are where the per-shape answers do the most."""
    state.quotas = q
    queue = run_first(state, first + (fillers(state) if busy else []), config, 1000.0) + second
    with groups_from_the_start():
        fast = decide_snapshot(copy.deepcopy(state), queue, config)
    assert fast == plain(state, queue, config, q)
