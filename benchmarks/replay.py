"""Time replay under contention: GPUYard's queueing against strict FIFO, FIFO with EASY backfill and first fit.

    python benchmarks/replay.py                                   # the setting of docs/benchmarks.md
    python benchmarks/replay.py --cluster-fraction 0.1 --speedup 200 --policies firstfit,gpuyard
    python benchmarks/replay.py --offsets 0,1,2 --json replay.json   # several sub-clusters ("seeds")

The default pod file is replayed in time (`shared/scheduling/sim/timemode.py`: arrivals at creation_time /
speed-up, trace runtimes, time limit = runtime) on every (1/F)-th node of the openb GPU node list. The time
replay has no randomness; what varies between "seeds" is which nodes make the sub-cluster: offset k keeps the
nodes k, k + 1/F, k + 2/F, ... Each row: mean and p95 JCT; mean, p95, p99 and p99.9 wait, longest wait
(starvation) and waits over an hour; jobs never started, and the GPU allocation over the arrival window (1st to 99th percentile of the arrivals), which must exceed 70% for
the replay to say anything about contention. Policies are the simulator's presets
(`shared/scheduling/sim/presets.py`): fifo (strict order), fifo-backfill (classic EASY: one reservation),
firstfit (GPUYard's queueing with first fit), gpuyard (the default configuration); `name:depth=K` runs a
preset with `reservation_depth=K`, `name:scarce=off` without keeping scarce nodes for the jobs that fit only
there (`SchedulerConfig.keep_scarce_nodes`), `name:window=S` with that short-first window (0: arrival order, the
line before it) and `name:shapes=K` with K reservations per shape class. Prints one JSON object; the table goes to stderr. CPU seconds per run are
given (the machine is shared; wall time is not comparable between runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpuyard.shared.scheduling.sim import presets, timemode
from gpuyard.shared.scheduling.sim.cluster import popularity
from gpuyard.shared.scheduling.sim.timemode import run_time
from gpuyard.shared.scheduling.sim.trace import SHIPPED_DIR, NodeTable, read_nodes, read_pods

SETUP = {
    "cluster_fraction": 0.1,
    "speedup": 200.0,
    "limit_factor": 1.0,
}  # 122 nodes / 626 GPUs; offered load ~97% of the window
POLICIES = "fifo,fifo-backfill,firstfit,gpuyard"
SHOWN = (
    "avg_jct_s",
    "p95_jct_s",
    "avg_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "p99_9_wait_s",
    "longest_wait_s",
    "waits_over_1h",
    "never_started",
    "gpu_allocation_mean_pct",
)


def sub_cluster(nodes: NodeTable, fraction: float, offset: int = 0) -> NodeTable:
    """Every (1/fraction)-th node from `offset` (offset 0 is `gpuyard sim --cluster-fraction`'s choice)."""
    step = max(1, round(1 / fraction))
    keep = np.arange(offset % step, len(nodes.names), step)
    return NodeTable(
        [nodes.names[i] for i in keep],
        nodes.cpus[keep],
        nodes.memory[keep],
        nodes.gpus[keep],
        [nodes.models[i] for i in keep],
    )


def config(spec: str, shapes: tuple):
    """A preset name, optionally with options `:depth=K` (its reservation depth), `:scarce=off` (no nodes
    kept for the jobs that fit only there, `SchedulerConfig.keep_scarce_nodes`), `:window=S` (the
    short-first window in seconds, `SchedulerConfig.short_first_window`; 0 = arrival order, as before it) and
    `:shapes=K` (the reservations for the oldest jobs of each shape, `SchedulerConfig.shape_reservations`)."""
    name, *options = spec.split(":")
    cfg = presets.config_for(name, shapes)
    for option in options:
        key, _, value = option.partition("=")
        if key == "depth":
            cfg = replace(cfg, reservation_depth=int(value))
        elif key == "scarce" and value in ("on", "off"):
            cfg = replace(cfg, keep_scarce_nodes=value == "on")
        elif key == "window":
            cfg = replace(cfg, short_first_window=float(value))
        elif key == "shapes":
            cfg = replace(cfg, shape_reservations=int(value))
        else:
            raise ValueError(f"unknown option {option!r} (depth=K, scarce=on|off, window=SECONDS, shapes=K)")
    return cfg


def replay(
    trace: str,
    fraction: float,
    speedup: float,
    specs: list[str],
    offsets: list[int],
    limit_factor: float = 1.0,
) -> dict:
    all_nodes = read_nodes(SHIPPED_DIR / "openb_node_list_gpu_node.csv")
    pods = read_pods(SHIPPED_DIR / f"openb_pod_list_{trace}.csv")
    shapes = popularity(pods)
    runs: dict[str, list[dict]] = {spec: [] for spec in specs}
    for offset in offsets:
        nodes = sub_cluster(all_nodes, fraction, offset)
        for spec in specs:
            cpu = time.process_time()
            run = run_time(
                nodes, pods, spec, config(spec, shapes), limit_factor=limit_factor, speedup=speedup
            )
            summary = {**run.summary(), "offset": offset, "gpus": nodes.total_gpus}
            summary["cpu_seconds"] = time.process_time() - cpu
            runs[spec].append(summary)
            print(f"offset {offset} {spec}: " + _cells(summary), file=sys.stderr, flush=True)
    mean = {
        spec: {key: float(np.mean([r[key] for r in rows])) for key in SHOWN} for spec, rows in runs.items()
    }
    for spec, row in mean.items():
        print(f"mean {spec}: " + _cells(row), file=sys.stderr)
    return {
        "setup": {
            "trace": trace,
            "cluster_fraction": fraction,
            "speedup": speedup,
            "limit_factor": limit_factor,
            "offsets": offsets,
            "full_cycles": timemode.FULL_CYCLES,
        },
        "mean": mean,
        "runs": runs,
    }


def _cells(row: dict) -> str:
    return (
        f"avg JCT {row['avg_jct_s']:.0f} s, p95 JCT {row['p95_jct_s']:.0f} s, avg wait {row['avg_wait_s']:.0f} s, "
        f"p95/p99/p99.9 wait {row['p95_wait_s']:.0f} / {row['p99_wait_s']:.0f} / {row['p99_9_wait_s']:.0f} s, "
        f"longest wait {row['longest_wait_s']:.0f} s, waits over 1 h {row['waits_over_1h']:.0f}, "
        f"never started {row['never_started']:.0f}, "
        f"GPU allocation (arrival window) {row['gpu_allocation_mean_pct']:.1f}%"
        + (f", {row['cpu_seconds']:.0f} CPU s" if "cpu_seconds" in row else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="default", help="pod file: openb_pod_list_NAME.csv")
    parser.add_argument("--cluster-fraction", type=float, default=SETUP["cluster_fraction"])
    parser.add_argument("--speedup", type=float, default=SETUP["speedup"])
    parser.add_argument(
        "--limit-factor", type=float, default=SETUP["limit_factor"], help="time limit = runtime x this"
    )
    parser.add_argument(
        "--policies",
        default=POLICIES,
        help="presets, comma-separated; NAME:depth=K, NAME:scarce=off, NAME:window=S, NAME:shapes=K",
    )
    parser.add_argument("--offsets", default="0", help="sub-clusters, comma-separated node offsets")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument(
        "--full-cycles",
        action="store_true",
        help="every cycle looks at every waiting job (timemode.FULL_CYCLES: the shortcut off; slower)",
    )
    args = parser.parse_args()
    timemode.FULL_CYCLES = args.full_cycles
    result = replay(
        args.trace,
        args.cluster_fraction,
        args.speedup,
        [s.strip() for s in args.policies.split(",") if s.strip()],
        [int(k) for k in args.offsets.split(",")],
        args.limit_factor,
    )
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
