"""Scheduler benchmarks: placement quality on the openb traces, and decision speed.

    python benchmarks/scheduler.py            # everything (10 seeds per trace file; tens of minutes on 2 cores)
    python benchmarks/scheduler.py --quick    # 2 seeds, smaller speed cases (a few minutes)
    python benchmarks/scheduler.py --only speed|quality|time [--json FILE]

Quality: inflation replay (FGD paper protocol) of every pod file for firstfit, bestfit, fgd and gpuyard, next
to the published BestFit and FGD columns. Time: the time replay under contention of `benchmarks/replay.py`
(its setting and policies; the six sub-clusters of docs/benchmarks.md, `--offsets`; sub-cluster 0 with
`--quick`), called from here, not a second copy.
Speed: 50,000 mixed jobs placed from empty onto 5,000 nodes x 8 GPUs; one cycle with 10,000 waiting jobs on a
full 1,000-node cluster, as the live service runs it (`decide` on a `HeldCluster`) in the cases of `CYCLE_CASES`
(all blocked, 10 % of the cluster freed, 3 jobs ended, a high-priority burst that preempts), each with the jobs
placed and preempted per cycle; as `decide` on a snapshot (its index built in the call); the held cycle's
time for 1k / 10k / 50k waiting jobs, all blocked and freed. Wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpuyard.shared.scheduling import (
    Allocation,
    CapacityIndex,
    ClusterState,
    CycleResult,
    Gpu,
    GpuAssignment,
    HeldCluster,
    JobRequest,
    Node,
    ReplicaAssignment,
    SchedulerConfig,
    decide,
)
from gpuyard.shared.scheduling.cluster import allocate
from gpuyard.shared.scheduling.cycle import gc_paused
from gpuyard.shared.scheduling.sim.cli import PUBLISHED_AT_100
from gpuyard.shared.scheduling.sim.inflation import InflationSummary, run_inflation
from gpuyard.shared.scheduling.sim.trace import SHIPPED, read_nodes, read_pods

# imported as benchmarks.scheduler (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks import replay
else:
    import replay

GIB = 1 << 30
POD_FILES = ["default", "gpushare40", "multigpu20", "gpuspec33", "cpu050"]
QUALITY_POLICIES = ["firstfit", "bestfit", "fgd", "gpuyard"]
# The pod files gpuyard does not ship (multigpu20, gpuspec33, cpu050) are read from the team's copy of the trace.
TEAM_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-2023"
TIME_OFFSETS = "0,1,2,3,4,5"  # the sub-clusters of docs/benchmarks.md's time replay


def trace_file(name: str) -> str | Path:
    """A file shipped with gpuyard by its name; another of the trace by its path in the team's copy."""
    return name if name in SHIPPED else TEAM_TRACES / name


# ------------------------------------------------------------------------------------------------ speed
def make_cluster(nodes: int, gpus: int = 8) -> dict[str, Node]:
    return {
        f"node-{i:05d}": Node(
            f"node-{i:05d}", [Gpu(k, "A100", 80 * GIB) for k in range(gpus)], 128, 1024 * GIB
        )
        for i in range(nodes)
    }


def mixed_jobs(n: int, seed: int = 1, prefix: str = "job") -> list[JobRequest]:
    """Whole (1/2/4/8), fractional (0.25/0.5), gangs (2-4 x 8 GPUs) and CPU-only jobs of 8 tenants."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(6, size=n, p=[0.35, 0.05, 0.01, 0.30, 0.006, 0.284])
    out = []
    for k, kind in enumerate(kinds.tolist()):
        replicas = 1
        if kind == 0:
            gpus = 1.0
        elif kind == 1:
            gpus = float(rng.choice([2, 4]))
        elif kind == 2:
            gpus = 8.0
        elif kind == 3:
            gpus = float(rng.choice([0.25, 0.5]))
        elif kind == 4:
            gpus, replicas = 8.0, int(rng.integers(2, 5))
        else:
            gpus = 0.0
        out.append(
            JobRequest(
                f"{prefix}-{k:06d}",
                f"tenant-{k % 8}",
                gpus=gpus,
                replicas=replicas,
                cpus=float(max(1, 4 * gpus)) if gpus >= 1 else 2.0,
                memory=int(16 * GIB * max(gpus, 0.5)),
                user=f"user-{k % 32}",
                submitted_at=float(k),
                timeout=3600.0,
            )
        )
    return out


def timed(run, repeat: int) -> tuple[list[float], list[float], object]:
    """Wall and CPU seconds of `run(k)` for k in range(repeat), and its last result. The machine is shared: best,
    median and worst are reported; CPU time (this process only) is what other work on the machine disturbs
    least."""
    wall, cpu, result = [], [], None
    for k in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = run(k)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return wall, cpu, result


def seconds(wall: list[float], cpu: list[float]) -> dict:
    return {
        "seconds": min(wall),
        "seconds_median": statistics.median(wall),
        "seconds_max": max(wall),
        "cpu_seconds": min(cpu),
        "cpu_seconds_median": statistics.median(cpu),
        "cpu_seconds_max": max(cpu),
        "runs": len(wall),
    }


def decide_snapshot(state: ClusterState, queue: list[JobRequest], config: SchedulerConfig) -> CycleResult:
    """`decide` on a snapshot: the index built from it, the placements applied to its nodes afterwards."""
    with gc_paused():
        result = decide(
            CapacityIndex.from_state(state), state.running, queue, config, state.quotas, state.now
        )
        for placement in result.placements:
            for r in placement.replicas:
                allocate(state.nodes[r.node], (r,))
    return result


def decide_held(
    held: HeldCluster, queue: list[JobRequest], config: SchedulerConfig, now: float
) -> CycleResult:
    """`decide` on the held cluster, as the live service runs a cycle."""
    index = held.index()
    result = decide(index, held.allocations(), queue, config, None, now, held.kinds)
    held.decided(result)
    return result


def bench_placement_rate(nodes: int, jobs: int, config: SchedulerConfig, repeat: int = 3) -> dict:
    """One `decide` on a snapshot from empty (a fresh state each run, not timed)."""
    queue = mixed_jobs(jobs)
    states = [ClusterState(make_cluster(nodes)) for _ in range(repeat)]
    wall, cpu, result = timed(lambda k: decide_snapshot(states[k], queue, config), repeat)
    placed = len(result.placements)
    out = seconds(wall, cpu)
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "jobs": jobs,
        "placed": placed,
        "replicas": sum(len(p.replicas) for p in result.placements),
        **out,
        "placements_per_s": placed / out["seconds"],
        "placements_per_s_median": placed / out["seconds_median"],
        "placements_per_s_min": placed / out["seconds_max"],
        "placements_per_cpu_s": placed / out["cpu_seconds"],
        "policy": config.policy,
    }


def full_cluster(nodes: int) -> ClusterState:
    state = ClusterState(make_cluster(nodes), now=100_000.0)
    running = []
    for name, node in state.nodes.items():
        for g in node.gpus:
            j = JobRequest(
                f"run-{name}-{g.index}",
                f"tenant-{g.index % 8}",
                gpus=1,
                cpus=16,
                memory=64 * GIB,
                timeout=36_000,
            )
            g.allocated = 1.0
            node.allocated_cpus += 16
            node.allocated_memory += 64 * GIB
            running.append(
                Allocation(
                    j, (ReplicaAssignment(0, name, (GpuAssignment(g.index),), 16, 64 * GIB),), 50_000.0
                )
            )
    state.running = running
    return state


def waiting_jobs(n: int) -> list[JobRequest]:
    queue = mixed_jobs(n, seed=2, prefix="wait")
    return [replace(j, submitted_at=90_000.0 + k) for k, j in enumerate(queue)]


CYCLE_CASES = {
    "blocked": "full cluster, every waiting job blocked; per cycle one running job ends and another takes its GPU",
    "freed": "10 % of the running jobs end before each cycle (scattered, seeded); what is placed is put",
    "trickle": "3 running jobs end before each cycle (fewer than the reservations the oldest jobs get); what is "
    "placed is put",
    "burst": "a burst of 200 high-priority 1-GPU jobs on the full cluster; each cycle places the jobs whose "
    "victims were preempted by the cycle before (their grace over) and preempts for the next",
}


def bench_full_cycle(
    nodes: int, waiting: int, config: SchedulerConfig, repeat: int = 5, case: str = "blocked"
) -> dict:
    """The live service's cycle on a `HeldCluster` that already holds the full cluster (indexed by a first
    cycle, not timed). Before each timed cycle, not timed: the change of its case (`CYCLE_CASES`), what the
    service does with the previous cycle's result (placements `put`, victims `drop`ped and requeued, placed
    jobs out of the queue), and the same cycle's decisions on the equivalent snapshot, which the held cycle
    must equal."""
    queue = waiting_jobs(waiting)
    state = full_cluster(nodes)
    if case == "burst":
        queue += [
            JobRequest(
                f"burst-{k:04d}",
                f"tenant-{k % 8}",
                gpus=1,
                cpus=4,
                memory=16 * GIB,
                priority=100,
                submitted_at=99_000.0 + k,
                timeout=3600.0,
            )
            for k in range(200)
        ]
    held = HeldCluster()
    for node in make_cluster(nodes).values():
        held.put_node(node)
    for alloc in state.running:
        held.put(alloc)
    rng = np.random.default_rng(3)
    pending = {"result": decide_held(held, queue, config, state.now)}  # the first cycle indexes; not timed
    placed, preempted, timed_wall, timed_cpu = [], [], [], []

    def apply(result: CycleResult, now: float) -> None:
        by_id = {j.job_id: j for j in queue}
        for p in result.placements:
            held.put(Allocation(by_id[p.job_id], p.replicas, now, p.borrowed))
        gone = {p.job_id for p in result.placements}
        for victim in result.preemptions:  # the grace is over: the victim leaves and waits again
            alloc = next(a for a in held.allocations() if a.job.job_id == victim.job_id)
            held.drop(victim.job_id)
            queue.append(alloc.job)
        queue[:] = [j for j in queue if j.job_id not in gone]

    for k in range(repeat):
        now = state.now + 10.0 * (k + 1)
        apply(pending["result"], now)
        running = held.allocations()
        if case == "blocked":
            ended = running[k]
            held.drop(ended.job.job_id)
            held.put(Allocation(replace(ended.job, job_id=f"next-{k}"), ended.replicas, now))
        elif case == "freed":
            for i in rng.choice(len(running), size=len(running) // 10, replace=False):
                held.drop(running[i].job.job_id)
        elif case == "trickle":
            for i in rng.choice(len(running), size=3, replace=False):
                held.drop(running[i].job.job_id)
        expected = decide_snapshot(held.snapshot(now), queue, config)
        wall, cpu, result = timed(lambda _k, now=now: decide_held(held, queue, config, now), 1)
        assert result == expected, f"{case}: the held cycle decided otherwise than the snapshot"
        timed_wall += wall
        timed_cpu += cpu
        placed.append(len(result.placements))
        preempted.append(len(result.preemptions))
        pending["result"] = result
    summary = cycle_summary(nodes, waiting, config, timed_wall, timed_cpu, result)
    return {
        **summary,
        "case": case,
        "placed_per_cycle": placed,
        "preempted_per_cycle": preempted,
        "wall_ms_per_cycle": [round(w * 1e3, 1) for w in timed_wall],
        "cpu_ms_per_cycle": [round(c * 1e3, 1) for c in timed_cpu],
    }


def bench_snapshot_cycle(nodes: int, waiting: int, config: SchedulerConfig, repeat: int = 5) -> dict:
    """The same cycle as one `decide` on a snapshot (the index built and the running jobs counted in the
    call; the snapshot itself is made before, not timed)."""
    queue = waiting_jobs(waiting)
    states = [full_cluster(nodes) for _ in range(repeat)]
    return cycle_summary(
        nodes, waiting, config, *timed(lambda k: decide_snapshot(states[k], queue, config), repeat)
    )


def cycle_summary(nodes: int, waiting: int, config: SchedulerConfig, wall, cpu, result) -> dict:
    return {
        "nodes": nodes,
        "waiting": waiting,
        **seconds(wall, cpu),
        "placed": len(result.placements),
        "preempted": len(result.preemptions),
        "pending": len(result.pending),
        "policy": config.policy,
    }


def speed(quick: bool, repeat: int = 3) -> dict:
    config = SchedulerConfig()  # GPUYard's default scheduler
    out = {"config": "SchedulerConfig() (policy gpuyard, fair share, EASY backfill, preemption)"}
    nodes, jobs = (1000, 10_000) if quick else (5000, 50_000)
    out["placement"] = bench_placement_rate(nodes, jobs, config, repeat)
    print(f"placement: {out['placement']}", file=sys.stderr)
    out["placement_firstfit"] = bench_placement_rate(nodes, jobs, SchedulerConfig(policy="firstfit"), repeat)
    print(f"placement firstfit: {out['placement_firstfit']}", file=sys.stderr)
    out["full_cycle"] = {}
    for case in CYCLE_CASES:
        out["full_cycle"][case] = bench_full_cycle(1000, 10_000, config, max(5, repeat), case)
        print(f"full cycle, {case}: {out['full_cycle'][case]}", file=sys.stderr)
    out["full_cycle_snapshot"] = bench_snapshot_cycle(1000, 10_000, config, max(5, repeat))
    print(f"full cycle, snapshot: {out['full_cycle_snapshot']}", file=sys.stderr)
    out["scaling"] = [
        bench_full_cycle(1000, n, config, max(5, repeat), case)
        for case in ("blocked", "freed")
        for n in ([1000, 10_000] if quick else [1000, 10_000, 50_000])
    ]
    print(f"scaling: {out['scaling']}", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------------------ quality
def quality(quick: bool, files: list[str] = POD_FILES, n_seeds: int | None = None) -> dict:
    seeds = list(range(42, 42 + (n_seeds or (2 if quick else 10))))
    nodes = read_nodes(trace_file("openb_node_list_gpu_node.csv"))
    out = {}
    for name in files:
        pods = read_pods(trace_file(f"openb_pod_list_{name}.csv"))
        row = {}
        for policy in QUALITY_POLICIES:
            summary = InflationSummary(policy, [run_inflation(nodes, pods, policy, s) for s in seeds])
            row[policy] = {"mean": summary.mean_at_100, "std": summary.std_at_100}
        published = PUBLISHED_AT_100[f"openb_pod_list_{name}"]
        row["published_bestfit"], row["published_fgd"] = published
        out[name] = row
        cells = "  ".join(f"{p} {row[p]['mean']:.2f}" for p in QUALITY_POLICIES)
        print(
            f"{name}: {cells}  (published BestFit {published[0]:.2f}, FGD {published[1]:.2f})",
            file=sys.stderr,
        )
    return {"seeds": seeds, "unallocated_at_100": out}


def time_replay(offsets: list[int]) -> dict:
    """`benchmarks/replay.py` with its defaults (every 10th node, arrivals 200x faster, its policies) on these
    sub-clusters."""
    return replay.replay(
        "default",
        replay.SETUP["cluster_fraction"],
        replay.SETUP["speedup"],
        replay.POLICIES.split(","),
        offsets,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["speed", "quality", "time"])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--files", default=",".join(POD_FILES), help="quality: pod files (default: all five)")
    parser.add_argument("--seeds", type=int, help="quality: seeds 42, 43, ... (default 10; 2 with --quick)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="speed: runs per case (best, median and worst reported)"
    )
    parser.add_argument(
        "--offsets",
        help=f"time: sub-clusters of benchmarks/replay.py (default {TIME_OFFSETS}; 0 with --quick)",
    )
    args = parser.parse_args()
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    }
    if args.only in (None, "speed"):
        results["speed"] = speed(args.quick, args.repeat)
    if args.only in (None, "time"):
        offsets = args.offsets or ("0" if args.quick else TIME_OFFSETS)
        results["time"] = time_replay([int(k) for k in offsets.split(",")])
    if args.only in (None, "quality"):
        results["quality"] = quality(args.quick, args.files.split(","), args.seeds)
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
