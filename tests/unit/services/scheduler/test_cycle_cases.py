"""Table-driven cases for one scheduling cycle (Kueue style): start cluster, queue -> exact decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuyard.shared.scheduling import SchedulerConfig
from tests.unit.services.scheduler.builders import GIB, cluster, decide_snapshot, job, node, running, where

HOUR = 3600.0
NOW = 10_000.0


@dataclass
class Case:
    name: str
    state: Any  # () -> ClusterState
    queue: list
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    placed: dict[str, list | None] = field(default_factory=dict)  # job -> [(node, gpus)], None = anywhere
    preempted: list[tuple[str, str, str]] = field(default_factory=list)  # (victim, reason, by)
    pending: dict[str, tuple[str, str]] = field(default_factory=dict)  # job -> (code, message)
    estimated: dict[str, float | None] = field(default_factory=dict)


def ff(**kw) -> SchedulerConfig:
    return SchedulerConfig(policy="firstfit", **kw)


def cordoned(n):
    """A node cordoned or drained by an admin: nothing new goes there until it is uncordoned."""
    n.schedulable = False
    return n


def two_half_busy_nodes():
    """n0 and n1, each with 4 of its 8 GPUs held by a job that ends after 100 s (n0) or 200 s (n1)."""
    return cluster(
        node("n0", 8),
        node("n1", 8),
        running=[
            running(job("a", 4, timeout=100), "n0", [0, 1, 2, 3], NOW),
            running(job("b", 4, timeout=200), "n1", [0, 1, 2, 3], NOW),
        ],
    )


def drains_n1_then_n0():
    """n0 and n1, each with 4 of its 8 GPUs held by a job that ends after 200 s (n0) or 100 s (n1)."""
    return cluster(
        node("n0", 8),
        node("n1", 8),
        running=[
            running(job("a", 4, timeout=200), "n0", [0, 1, 2, 3], NOW),
            running(job("b", 4, timeout=100), "n1", [0, 1, 2, 3], NOW),
        ],
    )


# One reservation for the oldest job of all ("old", 6 GPUs: n1 at 100 s); "big" (8 GPUs) is the oldest of
# its shape, and the only one.
OLDEST_OF_A_SHAPE = [
    job("old", 6, timeout=HOUR, submitted_at=1),
    job("big", 8, timeout=HOUR, submitted_at=2),
    job("long", 4, timeout=10 * HOUR, submitted_at=3),
]

CASES = [
    Case(
        "whole GPUs go to the first node with room",
        lambda: cluster(node("n0"), node("n1")),
        [job("a", 4)],
        ff(),
        placed={"a": [("n0", (0, 1, 2, 3))]},
    ),
    Case(
        "no node has a block large enough",
        lambda: cluster(
            node("n0", 4),
            node("n1", 4),
            running=[running(job("x", 2), "n0", [0, 1], 0), running(job("y", 3), "n1", [0, 1, 2], 0)],
        ),
        [job("a", 4)],
        ff(preemption=False),
        pending={
            "a": (
                "insufficient_gpus",
                "needs 4 GPUs on one node; the largest free block is 2 (n0); 1st in line",
            )
        },
    ),
    Case(
        "larger than any node",
        lambda: cluster(node("n0"), node("n1")),
        [job("a", 16)],
        pending={"a": ("too_large", "needs 16 GPUs on one node; the largest node has 8 (n0)")},
    ),
    Case(
        "no node has joined yet",
        lambda: cluster(),
        [job("a", 1), job("b", 0.25)],
        pending={
            "a": ("no_nodes", "no node has joined yet (no executor has announced one); 1st in line"),
            "b": ("no_nodes", "no node has joined yet (no executor has announced one); 2nd in line"),
        },
    ),
    Case(
        "GPU model nobody has",
        lambda: cluster(node("n0")),
        [job("a", 1, gpu_models=("H100",))],
        pending={"a": ("no_matching_gpu_model", "needs GPU model H100; no node has one")},
    ),
    Case(
        "GPU model constraint picks the matching node",
        lambda: cluster(node("n0", model="T4"), node("n1", model="A100")),
        [job("a", 2, gpu_models=("A100",))],
        ff(),
        placed={"a": [("n1", (0, 1))]},
    ),
    Case(
        "a gang that does not fit holds nothing",
        lambda: cluster(node("n0"), node("n1"), running=[running(job("x", 1), "n1", [0], 0)]),
        [job("g", 8, replicas=2), job("s", 1, submitted_at=9e9)],
        ff(preemption=False, backfill="greedy"),
        placed={"s": [("n0", (0,))]},
        pending={
            "g": (
                "gang_does_not_fit",
                "needs 2 workers × 8 whole GPUs placed together; only about 1 fits now, short of GPUs: 15 GPUs "
                "idle, at most 8 on one node; 1st in line",
            )
        },
    ),
    Case(
        "a gang short of CPUs says so, and how many are free",
        lambda: cluster(
            node("n0", 8, cpus=8),
            node("n1", 8, cpus=8),
            running=[running(job("x", 1, cpus=6), "n0", [0], 0)],
        ),
        [job("g", 1, replicas=4, cpus=4)],
        ff(preemption=False),
        pending={
            "g": (
                "gang_does_not_fit",
                "needs 4 workers × 1 whole GPU placed together; only about 2 fit now, short of CPUs: 10 CPUs "
                "free, at most 8 CPUs on one node; 1st in line",
            )
        },
    ),
    Case(
        "a gang of shares short of memory, none fitting now",
        lambda: cluster(
            node("n0", 2, memory=64 * GIB),
            running=[running(job("x", 0.5, memory=60 * GIB), "n0", [0], 0)],
        ),
        [job("g", 0.5, replicas=2, memory=8 * GIB)],
        ff(preemption=False),
        pending={
            "g": (
                "gang_does_not_fit",
                "needs 2 workers × 0.5 of a GPU placed together; none fits now, short of memory: 4 GiB free; "
                "1st in line",
            )
        },
    ),
    Case(
        "a job only a cordoned or drained node could hold waits in line for it, not too large",
        lambda: cluster(cordoned(node("vm", 4, cpus=2, memory=24683652 * 1024))),
        [job("serve", 0.25, cpus=1, memory=2 * GIB, submitted_at=1), job("train", 2, submitted_at=2)],
        pending={
            "serve": (
                "insufficient_gpu_share",
                "needs 0.25 of a GPU; the nodes that could hold it are out of service: 1 node cordoned or "
                "drained (vm); 1st in line",
            ),
            "train": (
                "insufficient_gpus",
                "needs 2 GPUs on one node; the nodes that could hold it are out of service: 1 node cordoned or "
                "drained (vm); 2nd in line",
            ),
        },
    ),
    Case(
        "beside a cordoned node, a job only it could hold names it; one no node could hold is too large",
        lambda: cluster(node("small", 2), cordoned(node("big", 8))),
        [job("four", 4, submitted_at=1), job("huge", 16, submitted_at=2), job("one", 1, submitted_at=3)],
        ff(),
        placed={"one": [("small", (0,))]},
        pending={
            "four": (
                "insufficient_gpus",
                "needs 4 GPUs on one node; the nodes that could hold it are out of service: 1 node cordoned or "
                "drained (big); 1st in line",
            ),
            "huge": ("too_large", "needs 16 GPUs on one node; the largest node has 8 (big)"),
        },
    ),
    Case(
        "a job too large for its CPUs and memory says the node's memory as a size",
        lambda: cluster(node("vm", 4, cpus=2, memory=24683652 * 1024)),
        [job("big", 0.25, cpus=4, memory=32 * GIB)],
        pending={
            "big": (
                "too_large",
                "needs 4 CPUs and 32 GiB per replica; the largest node has 2 CPUs and 23.5 GiB",
            )
        },
    ),
    Case(
        "a gang is placed whole across nodes",
        lambda: cluster(node("n0"), node("n1")),
        [job("g", 8, replicas=2)],
        ff(),
        placed={"g": [("n0", tuple(range(8))), ("n1", tuple(range(8)))]},
    ),
    Case(
        "best fit packs shares onto one GPU",
        lambda: cluster(node("n0", 2)),
        [job("a", 0.5, submitted_at=1), job("b", 0.5, submitted_at=2)],
        SchedulerConfig(policy="bestfit"),
        placed={"a": [("n0", (0,))], "b": [("n0", (0,))]},
    ),
    Case(
        "a share needs its memory slice on the same GPU",
        lambda: cluster(
            node("n0", 2, gpu_memory=40 * GIB),
            running=[running(job("x", 0.25), "n0", [0], 0, memory=30 * GIB)],
        ),
        [job("a", 0.25, gpu_memory=20 * GIB)],
        SchedulerConfig(policy="bestfit"),
        placed={"a": [("n0", (1,))]},
    ),
    Case(
        "a share without a memory slice fits a GPU whose memory is handed out beyond its size",
        lambda: cluster(  # (as a node that shrank, or slices written before a limit, leave it)
            node("n0", 1, gpu_memory=16 * GIB),
            running=[running(job("x", 0.25), "n0", [0], 0, memory=20 * GIB)],
        ),
        [job("a", 0.25)],
        SchedulerConfig(policy="bestfit"),
        placed={"a": [("n0", (0,))]},
    ),
    Case(
        "no GPU has the share free",
        lambda: cluster(node("n0", 1), running=[running(job("x", 0.75), "n0", [0], 0)]),
        [job("a", 0.5)],
        ff(preemption=False),
        pending={
            "a": (
                "insufficient_gpu_share",
                "needs 0.5 of a GPU; the largest free share is 0.25 (n0); 1st in line",
            )
        },
    ),
    Case(
        "higher priority goes first",
        lambda: cluster(node("n0", 1)),
        [job("low", 1, priority=10, submitted_at=1), job("high", 1, priority=100, submitted_at=2)],
        ff(preemption=False),
        placed={"high": [("n0", (0,))]},
        pending={
            "low": (
                "insufficient_gpus",
                "needs 1 GPU on one node; the largest free block is 0 (n0); 1st in line",
            )
        },
    ),
    Case(
        "a high-priority job preempts the youngest lower-priority job that frees enough",
        lambda: cluster(
            node("n0", 2),
            running=[
                running(job("old", 1, priority=10), "n0", [0], NOW - 5 * HOUR),
                running(job("young", 1, priority=10), "n0", [1], NOW - HOUR),
            ],
        ),
        [job("high", 1, priority=100)],
        ff(),
        preempted=[("young", "priority", "high")],
        pending={"high": ("preempting", "preempting 1 job (young) to free 1 GPU; 1st in line")},
    ),
    Case(
        "no victim before its minimum runtime",
        lambda: cluster(node("n0", 1), running=[running(job("fresh", 1, priority=10), "n0", [0], NOW - 60)]),
        [job("high", 1, priority=100)],
        ff(min_runtime_before_preemption=300),
        pending={
            "high": (
                "insufficient_gpus",
                "needs 1 GPU on one node; the largest free block is 0 (n0); 1st in line",
            )
        },
    ),
    Case(
        "same priority never preempts",
        lambda: cluster(node("n0", 1), running=[running(job("x", 1), "n0", [0], 0)]),
        [job("y", 1)],
        ff(),
        pending={
            "y": (
                "insufficient_gpus",
                "needs 1 GPU on one node; the largest free block is 0 (n0); 1st in line",
            )
        },
    ),
    Case(
        "an owner reclaims its guarantee from borrowed work (any priority)",
        lambda: cluster(
            node("n0", 2),
            running=[
                running(job("b1", 1, tenant="b", priority=100), "n0", [0], 0),
                running(job("b2", 1, tenant="b", priority=100), "n0", [1], 100),
            ],
            quotas={"a": 2, "b": 0},
        ),
        [job("a1", 1, tenant="a", priority=50)],
        ff(),
        preempted=[("b2", "reclaim", "a1")],
        pending={"a1": ("preempting", "preempting 1 job (b2) to free 1 GPU; 1st in line")},
    ),
    Case(
        "borrowing idle GPUs is allowed and flagged",
        lambda: cluster(node("n0", 2), quotas={"a": 1, "b": 1}),
        [job("a1", 2, tenant="a")],
        ff(),
        placed={"a1": [("n0", (0, 1))]},
    ),
    Case(
        "a tenant at its quota with nothing idle to borrow",
        lambda: cluster(
            node("n0", 2),
            running=[
                running(job("b1", 1, tenant="b"), "n0", [0], 0),
                running(job("a0", 1, tenant="a"), "n0", [1], 0),
            ],
            quotas={"a": 1, "b": 1},
        ),
        [job("a1", 1, tenant="a")],
        ff(),
        pending={
            "a1": (
                "quota_exhausted",
                "tenant a is at its quota 1/1 GPU and no idle GPUs can be borrowed (needs 1); 1st in line",
            )
        },
    ),
    Case(
        "a borrowing job short of CPUs, not GPUs, is told so (not that no GPU can be borrowed)",
        lambda: cluster(
            node("n0", 4, cpus=2),
            running=[running(job("a0", 1, tenant="a", cpus=2), "n0", [0], 0)],
            quotas={"a": 1, "b": 1},
        ),
        [job("a1", 1, tenant="a", cpus=1)],
        ff(),
        pending={
            "a1": (
                "insufficient_cpu_memory",
                "needs 1 GPU with 1 CPU and 0 B on one node; the nodes with 1 free GPU lack CPUs or memory; "
                "1st in line",
            )
        },
    ),
    Case(
        "borrowing switched off",
        lambda: cluster(node("n0", 4), quotas={"a": 1}),
        [job("a1", 2, tenant="a")],
        ff(borrowing=False),
        pending={
            "a1": (
                "borrowing_disabled",
                "tenant a is at its quota 0/1 GPU and borrowing is off; 1st in line",
            )
        },
    ),
    Case(
        "per-user cap inside a tenant",
        lambda: cluster(node("n0", 8), running=[running(job("x", 3, user="ann"), "n0", [0, 1, 2], 0)]),
        [job("a1", 2, user="ann", submitted_at=1), job("b1", 2, user="bob", submitted_at=2)],
        ff(user_gpu_cap={"*": 4}),
        placed={"b1": [("n0", (3, 4))]},
        pending={
            "a1": (
                "user_cap",
                "user ann of tenant t holds 3 of at most 4 GPUs; this job needs 2 more; 1st in line",
            )
        },
    ),
    Case(
        "retry backoff",
        lambda: cluster(node("n0")),
        [job("a", 1, not_before=NOW + 120)],
        pending={
            "a": ("retry_backoff", "waiting 2 min before the next attempt (retry backoff); 1st in line")
        },
    ),
    Case(
        "EASY backfill: short jobs pass, jobs that would delay the reservation wait",
        lambda: cluster(
            node("n0", 8),
            node("n1", 4),
            running=[
                running(job("long", 4, timeout=2 * HOUR), "n0", [0, 1, 2, 3], NOW - HOUR),
                running(job("other", 2), "n1", [0, 1], 0),
            ],
        ),
        [
            job("head", 8, submitted_at=1),
            job("forever", 4, submitted_at=2),
            job("short", 4, timeout=600, submitted_at=3),
            job("side", 2, submitted_at=4),
        ],
        ff(preemption=False, short_first_window=0),  # arrival order (no job passes another in line)
        placed={"short": [("n0", (4, 5, 6, 7))], "side": [("n1", (2, 3))]},
        pending={
            "head": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 1st in line; estimated start in about 60 min",
            ),
            "forever": (
                "backfill_would_delay",
                "fits now but would delay the reserved start of job head; 2nd in line",
            ),
        },
        estimated={"head": NOW + HOUR},
    ),
    Case(
        # Two whole-node jobs wait for two half-busy nodes that drain at different times. With one
        # reservation (classic EASY) only "big1" is protected: the long "small" job goes onto n1, the node
        # "big2" needs next, and big2 would wait for it (10 h) instead of for "b" (200 s): the starvation of
        # the line behind the first blocked job that the time replay showed.
        "reservations for the first blocked jobs: a long job does not take the node the second one needs",
        two_half_busy_nodes,
        [
            job("big1", 8, timeout=HOUR, submitted_at=1),
            job("big2", 8, timeout=HOUR, submitted_at=2),
            job("small", 4, timeout=10 * HOUR, submitted_at=3),
            job("quick", 4, timeout=50, submitted_at=4),
        ],
        ff(preemption=False, short_first_window=0),  # arrival order (no job passes another in line)
        placed={"quick": None},
        pending={
            "big1": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 1st in line; estimated start in about 2 min",
            ),
            "big2": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 2nd in line; estimated start in about 3 min",
            ),
            "small": (
                "backfill_would_delay",
                "fits now but would delay the reserved start of job big1; 3rd in line",
            ),
        },
        estimated={"big1": NOW + 100, "big2": NOW + 200},
    ),
    Case(
        "one reservation (reservation_depth=1, classic EASY) protects only the first blocked job",
        two_half_busy_nodes,
        [
            job("big1", 8, timeout=HOUR, submitted_at=1),
            job("big2", 8, timeout=HOUR, submitted_at=2),
            job("small", 4, timeout=10 * HOUR, submitted_at=3),
        ],
        ff(preemption=False, reservation_depth=1, short_first_window=0),  # classic EASY: in line order
        placed={"small": [("n1", (4, 5, 6, 7))]},
        pending={
            "big1": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 1st in line; estimated start in about 2 min",
            ),
            "big2": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 2nd in line",
            ),
        },
        estimated={"big1": NOW + 100, "big2": None},
    ),
    Case(
        # "big" is not among the reservation_depth oldest jobs (1 here), but it is the oldest of its shape: it
        # reserves n0 (free at 200 s), and the 10-hour job must not take the half of n0 that is free now.
        "the oldest job of each shape gets a reservation besides the reservation_depth oldest",
        drains_n1_then_n0,
        OLDEST_OF_A_SHAPE,
        ff(preemption=False, reservation_depth=1),
        pending={
            "old": (
                "insufficient_gpus",
                "needs 6 GPUs on one node; the largest free block is 4 (n0); 1st in line; estimated start in about 2 min",
            ),
            "big": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 2nd in line; estimated start in about 3 min",
            ),
            "long": (
                "backfill_would_delay",
                "fits now but would delay the reserved start of job big; 3rd in line",
            ),
        },
        estimated={"old": NOW + 100, "big": NOW + 200},
    ),
    Case(
        # The same without reservations per shape: the 10-hour job takes half of n0, and "big" waits for it.
        "without reservations per shape only the reservation_depth oldest are protected",
        drains_n1_then_n0,
        OLDEST_OF_A_SHAPE,
        ff(preemption=False, reservation_depth=1, shape_reservations=0),
        placed={"long": [("n0", (4, 5, 6, 7))]},
        pending={
            "old": (
                "insufficient_gpus",
                "needs 6 GPUs on one node; the largest free block is 4 (n0); 1st in line; estimated start in about 2 min",
            ),
            "big": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 2nd in line",
            ),
        },
        estimated={"old": NOW + 100, "big": None},
    ),
    Case(
        "strict order (backfill off) lets nothing pass a blocked job",
        lambda: cluster(node("n0", 8), running=[running(job("x", 4), "n0", [0, 1, 2, 3], 0)]),
        [job("head", 8, submitted_at=1), job("small", 1, submitted_at=2)],
        ff(preemption=False, backfill="off"),
        pending={
            "head": (
                "insufficient_gpus",
                "needs 8 GPUs on one node; the largest free block is 4 (n0); 1st in line",
            ),
            "small": ("blocked_by_head", "strict order: waits behind job head; 2nd in line"),
        },
    ),
    Case(
        "fair share serves the tenant with the smaller dominant share first",
        lambda: cluster(node("n0", 8), running=[running(job("x", 6, tenant="a"), "n0", list(range(6)), 0)]),
        [job("a1", 2, tenant="a", submitted_at=1), job("b1", 2, tenant="b", submitted_at=2)],
        ff(preemption=False),
        placed={"b1": [("n0", (6, 7))]},
        pending={
            "a1": (
                "insufficient_gpus",
                "needs 2 GPUs on one node; the largest free block is 0 (n0); 1st in line",
            )
        },
    ),
    Case(
        "positions count the waiting jobs in order",
        lambda: cluster(node("n0", 1), running=[running(job("x", 1), "n0", [0], 0)]),
        [job(f"w{k}", 1, submitted_at=k) for k in range(3)],
        ff(preemption=False),
        pending={
            f"w{k}": (
                "insufficient_gpus",
                f"needs 1 GPU on one node; the largest free block is 0 (n0); {p} in line",
            )
            for k, p in enumerate(["1st", "2nd", "3rd"])
        },
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cycle(case: Case) -> None:
    state = case.state()
    result = decide_snapshot(state, case.queue, case.config)

    placed = {p.job_id for p in result.placements}
    assert placed == set(case.placed), result.pending
    for job_id, expected in case.placed.items():
        if expected is not None:
            assert where(result, job_id) == expected
    assert [(p.job_id, p.reason, p.by_job) for p in result.preemptions] == case.preempted
    assert {k: (v.code, v.message) for k, v in result.pending.items()} == case.pending
    for job_id, start in case.estimated.items():
        assert result.pending[job_id].estimated_start == start
    assert placed.isdisjoint(result.pending) and placed | set(result.pending) == {
        j.job_id for j in case.queue
    }


def test_borrowed_flag() -> None:
    state = cluster(node("n0", 4), quotas={"a": 1})
    result = decide_snapshot(
        state, [job("a1", 1, tenant="a", submitted_at=1), job("a2", 1, tenant="a", submitted_at=2)], ff()
    )
    assert [(p.job_id, p.borrowed) for p in result.placements] == [("a1", False), ("a2", True)]


def test_schedule_applies_placements_to_the_state() -> None:
    state = cluster(node("n0", 2))
    decide_snapshot(state, [job("a", 0.5, cpus=4, memory=GIB)], ff())
    n0 = state.nodes["n0"]
    assert (n0.gpus[0].allocated, n0.allocated_cpus, n0.allocated_memory) == (0.5, 4, GIB)


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown placement policy"):
        decide_snapshot(cluster(node("n0")), [job("a")], SchedulerConfig(policy="nope"))


def test_short_first_window_lets_a_short_job_pass_and_keeps_reservations_with_the_oldest() -> None:
    """One free GPU: with the short-first window (the default) the 1-minute job that came a second after the
    10-hour one takes it; in arrival order (no window) the 10-hour one does. A whole-node job, the oldest,
    keeps its reservation although a short job is before it in line."""
    state = lambda: cluster(  # noqa: E731
        node("n0", 8), running=[running(job("x", 7, timeout=HOUR), "n0", list(range(7)), NOW - 10)]
    )
    queue = [job("long", 1, timeout=10 * HOUR, submitted_at=1), job("short", 1, timeout=60, submitted_at=2)]
    windowed = decide_snapshot(state(), queue, ff(preemption=False))
    assert [p.job_id for p in windowed.placements] == ["short"]
    plain = decide_snapshot(state(), queue, ff(preemption=False, short_first_window=0))
    assert [p.job_id for p in plain.placements] == ["long"]
    big = job("big", 8, timeout=HOUR, submitted_at=0)
    windowed = decide_snapshot(state(), [big, *queue], ff(preemption=False))
    assert [p.job_id for p in windowed.placements] == ["short"]
    assert windowed.pending["big"].estimated_start == NOW - 10 + HOUR
