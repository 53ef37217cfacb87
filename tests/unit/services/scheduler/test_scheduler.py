"""`decide` on a `HeldCluster`, the cluster held between cycles and told what changed, decides exactly what it decides on
the equivalent snapshot, after any sequence of changes; its capacity index never drifts from a rebuilt one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.scheduling import (
    Allocation,
    ClusterState,
    Gpu,
    GpuAssignment,
    HeldCluster,
    Node,
    ReplicaAssignment,
    SchedulerConfig,
    decide,
)
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.reasons import Blocker
from tests.unit.services.scheduler.builders import (
    GIB,
    decide_held,
    decide_snapshot,
    job,
    node,
    running,
    where,
)
from tests.unit.services.scheduler.test_fast_paths import (
    SETTINGS,
    TEMPLATES,
    alike_clusters,
    configs,
    groups_from_the_start,
    queues,
    quota_sets,
)

CHANGES = ["cycle", "cycle", "cycle", "end", "restart", "move", "put_node", "drop_node"]


def template_node(name: str, template: tuple) -> Node:
    model, gpus, cpus, mem, gmem = template
    return Node(name, [Gpu(k, model, gmem * GIB) for k in range(gpus)], cpus, mem * GIB)


def held(state: ClusterState) -> HeldCluster:
    scheduler = HeldCluster()
    for n in state.nodes.values():
        scheduler.put_node(n)
    return scheduler


def assert_same_index(a: CapacityIndex, b: CapacityIndex) -> None:
    assert a.names == b.names
    assert a.free == b.free and a.gpu_memory_free == b.gpu_memory_free
    for name in ("cpu_free", "mem_free", "idle", "max_free", "max_memory_free", "state", "schedulable"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@SETTINGS
@given(alike_clusters(), configs, quota_sets, st.data())
def test_held_scheduler_decides_like_a_snapshot_after_any_changes(state, config, quotas, data) -> None:
    scheduler = held(state)
    now = state.now
    for step in range(data.draw(st.integers(1, 8), label="steps")):
        change = data.draw(st.sampled_from(CHANGES), label="change")
        names = list(scheduler.nodes)
        jobs = sorted(scheduler.running)
        if change == "cycle":
            queue = data.draw(queues(f"s{step}-"), label="queue")
            with groups_from_the_start():  # the held index keeps its node groups up to date across cycles
                expected = decide_snapshot(scheduler.snapshot(now, quotas), queue, config)
                result = decide_held(scheduler, queue, now, quotas, config)
            assert result == expected
            by_id = {j.job_id: j for j in queue}
            for p in result.placements:  # the ones not recorded are given back at the next cycle
                if data.draw(st.booleans(), label="recorded"):
                    scheduler.put(Allocation(by_id[p.job_id], p.replicas, now, p.borrowed))
        elif change == "end" and jobs:
            scheduler.drop(data.draw(st.sampled_from(jobs), label="ended"))
        elif change == "restart" and jobs:
            alloc = scheduler.running[data.draw(st.sampled_from(jobs), label="restarted")]
            scheduler.put(replace(alloc, started_at=now - 400.0))
        elif change == "move" and jobs and names:
            alloc = scheduler.running[data.draw(st.sampled_from(jobs), label="moved")]
            width = max((g.index + 1 for r in alloc.replicas for g in r.gpus), default=0)
            targets = [n for n in names if len(scheduler.nodes[n].gpus) >= width]
            if targets:
                to = data.draw(st.sampled_from(targets), label="to")
                scheduler.put(replace(alloc, replicas=tuple(replace(r, node=to) for r in alloc.replicas)))
        elif change == "put_node":
            name = data.draw(st.sampled_from([*names, f"new{step}"]), label="node")
            width = len(scheduler.nodes[name].gpus) if name in scheduler.nodes else 0
            templates = [t for t in TEMPLATES if t[1] >= width]  # jobs on it keep their GPUs
            scheduler.put_node(template_node(name, data.draw(st.sampled_from(templates), label="template")))
        elif change == "drop_node" and names:
            scheduler.drop_node(data.draw(st.sampled_from(names), label="dropped"))
        now += data.draw(st.sampled_from([0.0, 200.0, 5000.0]), label="later")
    decide_held(
        scheduler, [], now, quotas, config
    )  # gives back the last cycle's placements that were not put
    assert_same_index(scheduler._index, CapacityIndex.from_state(scheduler.snapshot()))


def test_capacity_follows_what_is_put_and_dropped() -> None:
    scheduler = HeldCluster()
    scheduler.put_node(node("a", gpus=2))
    first = job("first", gpus=2, cpus=4)
    result = decide_held(scheduler, [first], 100.0)
    assert where(result, "first") == [("a", (0, 1))]
    scheduler.put(Allocation(first, result.placements[0].replicas, 100.0))
    waiting = decide_held(scheduler, [job("second")], 200.0).pending["second"]
    assert waiting.code == "insufficient_gpus"
    scheduler.drop("first")
    assert where(decide_held(scheduler, [job("second")], 300.0), "second") == [("a", (0,))]


def test_a_placement_not_put_is_given_back_at_the_next_cycle() -> None:
    scheduler = HeldCluster()
    scheduler.put_node(node("a", gpus=1))
    assert decide_held(scheduler, [job("lost")], 0.0).placements  # never recorded by the caller
    assert where(decide_held(scheduler, [job("next")], 1.0), "next") == [("a", (0,))]


def test_jobs_on_a_node_that_comes_later_count_once_it_is_put() -> None:
    scheduler = HeldCluster()
    scheduler.put_node(node("a", gpus=1))
    scheduler.put(running(job("early"), "b", [0]))
    decide_held(scheduler, [], 0.0)
    scheduler.put_node(node("b", gpus=1))
    result = decide_held(scheduler, [job("x", submitted_at=1.0), job("y", submitted_at=2.0)], 0.0)
    assert where(result, "x") == [("a", (0,))] and "y" in result.pending


def test_a_cycle_that_did_not_finish_leaves_no_trace_in_the_next_index() -> None:
    scheduler = HeldCluster()
    scheduler.put_node(node("a", gpus=2))
    index = scheduler.index()
    assert decide(index, [], [job("half-done", gpus=2)], SchedulerConfig(), None, 0.0).placements
    # the caller failed before `decided`: the placement in that index was never a decision it recorded
    assert_same_index(scheduler.index(), CapacityIndex.from_state(scheduler.snapshot()))


def test_reasons_sort_by_rank_then_code() -> None:
    codes = [PendingCode.BLOCKED_BY_HEAD, PendingCode.PREEMPTING, PendingCode.USER_CAP, PendingCode.NO_NODES]
    blockers = [Blocker(code, "", {}) for code in codes]
    in_order = sorted(blockers, key=lambda b: (b.code.rank, b.code))  # the order shown when several apply
    assert [b.code for b in in_order] == [
        PendingCode.NO_NODES,  # NO_FIT, and "no_nodes" < "user_cap"
        PendingCode.USER_CAP,
        PendingCode.PREEMPTING,  # PREEMPT
        PendingCode.BLOCKED_BY_HEAD,  # FIT
    ]


def test_reasons_render_their_message_when_read() -> None:
    blocker = Blocker(PendingCode.INSUFFICIENT_GPUS, "needs 8 GPUs on one node", {"needed_per_replica": 8})
    reason = blocker.at(2, estimated_start=8200.0, now=1000.0)
    assert reason.message == "needs 8 GPUs on one node; 2nd in line; estimated start in about 2.0 h"
    assert (reason.code, reason.position, reason.details["needed_per_replica"]) == ("insufficient_gpus", 2, 8)
    assert reason == blocker.at(2, 8200.0, 1000.0) and reason != blocker.at(3, 8200.0, 1000.0)
    assert blocker.at(11).message == "needs 8 GPUs on one node; 11th in line"


def test_a_replica_on_a_gpu_the_node_does_not_list_is_skipped() -> None:
    scheduler = HeldCluster()
    scheduler.put_node(node("a", gpus=2))
    scheduler.put(Allocation(job("j"), (ReplicaAssignment(0, "a", (GpuAssignment(7),)),)))
    assert scheduler.snapshot().nodes["a"].idle_gpus == 2
