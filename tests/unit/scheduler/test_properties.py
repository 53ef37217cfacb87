"""Property tests: invariants that hold for any small cluster, queue and configuration."""

from __future__ import annotations

import copy
import math
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.scheduler.core import Allocation, ClusterState, JobRequest, SchedulerConfig
from services.scheduler.core.placement import POLICIES
from services.scheduler.core.reasons import NEVER_HELD
from shared.reasons import PendingCode
from tests.unit.scheduler.builders import GIB, cluster, decide_snapshot, node

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TENANTS = ["a", "b", "c"]
USERS = ["u1", "u2"]


@st.composite
def clusters(draw) -> ClusterState:
    n = draw(st.integers(1, 4))
    nodes = [
        node(
            f"n{i}",
            gpus=draw(st.sampled_from([0, 1, 2, 4, 8])),
            model=draw(st.sampled_from(["A100", "T4"])),
            cpus=draw(st.sampled_from([8, 32, 64])),
            memory=draw(st.sampled_from([64, 256])) * GIB,
            gpu_memory=draw(st.sampled_from([16, 40])) * GIB,
        )
        for i in range(n)
    ]
    return cluster(*nodes)


@st.composite
def jobs(draw, prefix: str = "j", count: tuple[int, int] = (1, 14)) -> list[JobRequest]:
    out = []
    for k in range(draw(st.integers(*count))):
        whole = draw(st.booleans())
        gpus = (
            draw(st.sampled_from([1, 2, 4, 8])) if whole else draw(st.sampled_from([0, 0.1, 0.25, 0.5, 0.75]))
        )
        out.append(
            JobRequest(
                f"{prefix}{k}",
                draw(st.sampled_from(TENANTS)),
                gpus=gpus,
                replicas=draw(st.sampled_from([1, 1, 1, 2, 3])),
                cpus=draw(st.sampled_from([0, 1, 4, 16])),
                memory=draw(st.sampled_from([0, 8, 32])) * GIB,
                gpu_memory=draw(st.sampled_from([None, None, 8 * GIB, 20 * GIB])),
                gpu_models=draw(st.sampled_from([(), (), ("A100",), ("T4",)])),
                priority=draw(st.sampled_from([10, 50, 100])),
                user=draw(st.sampled_from(USERS)),
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
    reservation_depth=st.sampled_from([1, 2, 8]),
    preemption=st.booleans(),
    borrowing=st.booleans(),
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


@SETTINGS
@given(clusters(), jobs(), configs, quotas)
def test_one_cycle_invariants(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig, q
) -> None:
    state.quotas = q
    before = copy.deepcopy(state)
    result = decide_snapshot(state, queue, config)
    check_capacity(state)

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
            models = {g.model for g in before.nodes[r.node].gpus if g.index in {a.index for a in r.gpus}}
            assert not j.gpu_models or models <= set(j.gpu_models)

    # user caps hold for what this cycle placed
    cap = config.user_gpu_cap
    held: dict[tuple[str, str], float] = defaultdict(float)
    for p in result.placements:
        j = by_id[p.job_id]
        held[(j.tenant, j.user)] += j.total_gpus
    for (tenant, _user), gpus in held.items():
        limit = cap.get(tenant, cap.get("*"))
        assert limit is None or gpus <= limit + 1e-9

    # without borrowing, no tenant goes above its guarantee
    if q and not config.borrowing:
        per_tenant: dict[str, float] = defaultdict(float)
        for p in result.placements:
            per_tenant[by_id[p.job_id].tenant] += by_id[p.job_id].total_gpus
        for tenant, gpus in per_tenant.items():
            assert gpus <= q.get(tenant, 0.0) + 1e-9
        assert not any(p.borrowed for p in result.placements)


@SETTINGS
@given(clusters(), jobs(), configs, quotas)
def test_deterministic(state: ClusterState, queue: list[JobRequest], config: SchedulerConfig, q) -> None:
    state.quotas = q
    other = copy.deepcopy(state)
    assert decide_snapshot(state, queue, config) == decide_snapshot(other, list(reversed(queue)), config)


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(0, 8),
    st.integers(0, 12),
    st.sampled_from(sorted(POLICIES)),
)
def test_guarantee_is_reclaimed_from_borrowers(
    nodes: int, guarantee: int, borrowers: int, policy: str
) -> None:
    """Tenant b fills the cluster with borrowed 1-GPU jobs; tenant a (guaranteed `guarantee` GPUs) gets all of
    its guarantee back within a few cycles, by preempting only borrowed work."""
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
    for cycle in range(1, 4):
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


@SETTINGS
@given(clusters(), jobs(count=(1, 6)), st.sampled_from(sorted(POLICIES)))
def test_partial_gang_never_holds_capacity(state: ClusterState, queue: list[JobRequest], policy: str) -> None:
    """place_gang either places every replica or leaves the capacity exactly as it was."""
    from services.scheduler.core.demand import demand_of
    from services.scheduler.core.fragmentation import shape_of, typical_shapes
    from services.scheduler.core.gang import place_gang
    from services.scheduler.core.index import CapacityIndex
    from services.scheduler.core.placement import make_policy

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


no_limits = st.builds(  # no quotas and no user caps: nothing but the cluster's capacity stands in the way
    SchedulerConfig,
    policy=st.sampled_from(sorted(POLICIES)),
    fair_share=st.booleans(),
    backfill=st.sampled_from(["easy", "greedy", "off"]),
    preemption=st.booleans(),
    borrowing=st.booleans(),
)


@SETTINGS
@given(clusters(), jobs(count=(1, 1)), no_limits)
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


@SETTINGS
@given(clusters(), jobs(count=(2, 10)), no_limits.filter(lambda c: c.backfill != "off"))
def test_an_idle_cluster_places_something_when_any_job_fits(
    state: ClusterState, queue: list[JobRequest], config: SchedulerConfig
) -> None:
    """With backfill (easy or greedy), a queue behind a head that does not fit still gets the jobs that do:
    an idle cluster never ends a cycle with nothing placed while one of the waiting jobs fits it."""
    fitting = [j.job_id for j in queue if fits_idle(state, j)]
    result = decide_snapshot(state, queue, config)
    assert bool(result.placements) == bool(fitting), (fitting, {k: r.code for k, r in result.pending.items()})
