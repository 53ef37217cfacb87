"""Unhealthy or cordoned GPUs and cordoned nodes in the core: nothing new is placed on them, the node's other
GPUs still take work, what runs there stays, and a job that no longer fits says why."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.shared.contracts.policies import BackfillMode, Policy
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.scheduling import HeldCluster, SchedulerConfig
from tests.unit.services.scheduler.builders import (
    cluster,
    decide_held,
    decide_snapshot,
    job,
    node,
    running,
    where,
)


def out_of_service(n, *indices):
    for i in indices:
        n.gpus[i].usable = False
    return n


def test_an_unusable_gpu_is_skipped_and_the_nodes_other_gpus_still_take_work():
    state = cluster(out_of_service(node("a", gpus=2), 1))
    result = decide_snapshot(state, [job("j1"), job("j2")])
    assert where(result, "j1") == [("a", (0,))]
    assert "j2" not in {p.job_id for p in result.placements}
    assert result.pending["j2"].code == PendingCode.INSUFFICIENT_GPUS
    assert "1 GPU unhealthy or cordoned" in result.pending["j2"].message  # (it waits for GPU 0 to free)


def test_fractions_never_go_on_an_unusable_gpu():
    state = cluster(out_of_service(node("a", gpus=2), 0))
    result = decide_snapshot(state, [job(f"s{k}", gpus=0.25) for k in range(6)])
    placed = [g for p in result.placements for r in p.replicas for g in r.gpus]
    assert len(placed) == 4 and {g.index for g in placed} == {1}


def test_a_cordoned_node_takes_nothing_new_and_its_running_job_stays():
    a, b = node("a", gpus=2), node("b", gpus=2)
    a.schedulable = False
    held = job("held")
    state = cluster(a, b, running=[running(held, "a", [0])])
    result = decide_snapshot(state, [job("new1"), job("new2"), job("new3")])
    assert {r.node for p in result.placements for r in p.replicas} == {"b"}
    assert not result.preemptions


def test_a_job_that_fits_only_with_the_unhealthy_gpu_says_so():
    state = cluster(out_of_service(node("a", gpus=2), 1))
    result = decide_snapshot(state, [job("big", gpus=2)])
    reason = result.pending["big"]
    assert reason.code == PendingCode.TOO_LARGE
    assert "1 GPU unhealthy or cordoned" in reason.message
    assert reason.details["out_of_service_gpus"] == 1


def test_every_node_cordoned_says_so():
    a = node("a", gpus=2)
    a.schedulable = False
    result = decide_snapshot(cluster(a), [job("j")])
    assert "1 node cordoned" in result.pending["j"].message


def test_preemption_never_frees_an_unusable_gpu():
    """A low-priority job on a cordoned GPU is not preempted for a job that could only use that GPU."""
    low = job("low", priority=10)
    state = cluster(out_of_service(node("a", gpus=1), 0), running=[running(low, "a", [0])])
    result = decide_snapshot(
        state, [job("high", priority=90)], SchedulerConfig(min_runtime_before_preemption=0)
    )
    assert not result.placements and not result.preemptions


def test_the_held_cluster_rebuilds_when_a_gpu_turns_unusable():
    held = HeldCluster()
    held.put_node(node("a", gpus=2))
    first = decide_held(held, [job("j1")], now=1.0)
    assert where(first, "j1") == [("a", (0,))]
    held.put_node(out_of_service(node("a", gpus=2), 1))  # j1 was not put: GPU 0 is free again
    second = decide_held(held, [job("j2"), job("j3")], now=2.0)
    assert [g.index for p in second.placements for r in p.replicas for g in r.gpus] == [0]


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4),
    data=st.data(),
    policy=st.sampled_from(list(Policy)),
    backfill=st.sampled_from(list(BackfillMode)),
    shapes=st.lists(st.sampled_from([0.25, 0.5, 1, 2, 4]), min_size=1, max_size=12),
)
def test_nothing_is_ever_placed_on_an_unusable_gpu_or_a_cordoned_node(sizes, data, policy, backfill, shapes):
    nodes, banned = [], set()
    for k, size in enumerate(sizes):
        n = node(f"n{k}", gpus=size)
        n.schedulable = k == 0 or not data.draw(st.booleans(), label="cordon")
        for i in data.draw(st.sets(st.integers(0, size - 1)), label="unusable"):
            n.gpus[i].usable = False
            banned.add((n.name, i))
        if not n.schedulable:
            banned |= {(n.name, i) for i in range(size)}
        nodes.append(n)
    queue = [job(f"j{k}", gpus=g) for k, g in enumerate(shapes)]
    result = decide_snapshot(cluster(*nodes), queue, SchedulerConfig(policy=policy, backfill=backfill))
    used = {(r.node, g.index) for p in result.placements for r in p.replicas for g in r.gpus}
    assert not used & banned
    usable = sum(len(n.gpus) for n in nodes) - len(banned)
    if usable and any(g <= 1 for g in shapes):  # something fits on the usable GPUs of an empty cluster
        assert result.placements
